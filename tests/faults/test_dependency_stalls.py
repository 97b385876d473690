"""A stalled dependency costs only the requests that need it, and those get a fast 503 (issue 47,
DESIGN §9): a live stack with one gunicorn worker of four threads, its metadata database a
PostgreSQL reached through a relay that can stall (tcp_relay.py), while one part stops answering:

- the NDBlaze redis-server SIGSTOPped (accepts connections, never answers): before, a zarr chunk
  read hung for the whole stall (the buffer's client waited up to 300 s), the worker's threads
  filled with them, and `GET /v1/collection/`, a cutout of another channel and `/healthz` all
  timed out behind them;
- the cache and lock redis-server SIGSTOPped;
- the metadata database stalled (the relay forwards nothing).

Each time, while the part is stalled and a burst of requests that need it is in flight: the
requests that do not need it answer 200, those that need it answer 503 JSON naming the part,
each within FAST_S; `/healthz` answers within HEALTH_S and names the part; after the stall
everything answers 200 again with nothing restarted. FAST_S is the Redis timeout (3 s) plus a
loaded host's slack; before the fix the same requests took 20 s and more.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import psycopg
import pytest
import requests

from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.faults.tcp_relay import StallingRelay
from tests.security.conftest import admin_session, public_dataset

pytestmark = [pytest.mark.faults, pytest.mark.postgres]

PG = ("127.0.0.1", 5432)
FAST_S = 8.0  # a request, whether it needs the stalled part (503) or not (200)
HEALTH_S = 2.0  # /healthz: its probes give up after 0.8 s; the rest is a loaded host's slack
BURST = 8  # requests that need the stalled part, in flight at once (twice the worker's threads)
OCTET = {"Accept": "application/octet-stream"}


def _postgres_reachable() -> bool:
    try:
        psycopg.connect(f"postgres://postgres@{PG[0]}:{PG[1]}/postgres", connect_timeout=3).close()
        return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[StallingRelay, str]]:
    if not _postgres_reachable():
        pytest.skip("no PostgreSQL at 127.0.0.1:5432")
    name = f"ndstore_stall_{uuid.uuid4().hex[:8]}"
    admin = f"postgres://postgres@{PG[0]}:{PG[1]}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    relay = StallingRelay(PG).start()
    try:
        yield relay, f"postgres://postgres@127.0.0.1:{relay.port}/{name}"
    finally:
        relay.stop()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def stack(database: tuple[StallingRelay, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    env = own_stack_env({"DATABASE_URL": database[1], "NDSTORE_DEMO": "0", "NDSTORE_ANON_READ_RATE": "0",
                         "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_LOCKS": "redis",
                         "GUNICORN_CMD_ARGS": "--log-level warning"})
    with LocalStack(tmp_path_factory.mktemp("stalls"), port=free_port(), workers=1, threads=4,
                    with_merger=False, with_runner=False, extra_env=env) as local:
        s = admin_session(local.data_dir)
        public_dataset(s, local.url, "stall", (128, 128, 16), {"img": {"datatype": "uint8"},
                                                                "other": {"datatype": "uint8"}})
        data = np.arange(128 * 128 * 16, dtype=np.uint8).reshape(16, 128, 128)
        for ch in ("img", "other"):
            r = s.post(f"{local.url}/v1/cutout/stall/e/{ch}/0/0:128/0:128/0:16/", data=data.tobytes(),
                       headers={"Content-Type": "application/octet-stream"}, timeout=60)
            assert r.status_code == 201, r.text
        yield local


def _server(local: LocalStack, port: int) -> int:
    """The pid of the stack's redis-server on `port`."""
    for proc in local.procs:
        cmd = [str(arg) for arg in proc.args]  # type: ignore[union-attr]  # redis-server renames its process
        if "--port" in cmd and cmd[cmd.index("--port") + 1] == str(port):
            return proc.pid
    raise LookupError(f"no redis-server on port {port}")


@contextmanager
def paused(pid: int) -> Iterator[None]:
    import os

    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _timed(call: Callable[[], requests.Response]) -> tuple[requests.Response, float]:
    started = time.monotonic()
    r = call()
    return r, time.monotonic() - started


def _get(url: str, **kw: object) -> Callable[[], requests.Response]:
    return lambda: requests.get(url, timeout=60, **kw)  # type: ignore[arg-type]


def _check_burst(futures: list[Future[tuple[requests.Response, float]]], statuses: set[int], part: str) -> None:
    for future in futures:
        r, took = future.result(timeout=120)
        assert r.status_code in statuses, (r.status_code, r.text[:300])
        if r.status_code == 503:
            assert part.replace("_", " ") in r.json()["message"].lower() or part in r.json()["message"], r.text
            assert r.headers.get("Retry-After"), r.headers
        assert took < FAST_S, f"a request needing the stalled {part} took {took:.1f} s ({r.status_code})"


def _healthz_names(local: LocalStack, part: str) -> None:
    """Until /healthz names `part` as failing (each probe answered within HEALTH_S)."""
    deadline = time.monotonic() + 30
    while True:
        r, took = _timed(_get(f"{local.url}/healthz"))
        assert took < HEALTH_S, f"/healthz took {took:.1f} s"
        assert r.headers["Content-Type"].startswith("application/json"), r.text[:200]
        if r.status_code == 503 and r.json()["parts"].get(part) == "failing":
            return
        assert time.monotonic() < deadline, f"/healthz never named {part}: {r.status_code} {r.text}"
        time.sleep(0.3)


def _unaffected(local: LocalStack, token_session: requests.Session, urls: list[str]) -> None:
    for url in urls:
        headers = OCTET if "/cutout/" in url else {}
        r, took = _timed(lambda url=url, headers=headers: token_session.get(url, headers=headers, timeout=60))
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
        assert took < FAST_S, f"{url} took {took:.1f} s while an unrelated part was stalled"


def _all_well(local: LocalStack) -> None:
    deadline = time.monotonic() + 30
    while requests.get(f"{local.url}/healthz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the stack did not recover after the stall"
        time.sleep(0.3)
    s = admin_session(local.data_dir)
    for url in (f"{local.url}/v1/collection/", f"{local.url}/v1/cutout/stall/e/img/0/0:64/0:64/0:8/",
                f"{local.url}/v1/blaze/cutout/stall/e/img/0/0:64/0:64/0:8/"):
        r = s.get(url, headers=OCTET if "/cutout/" in url else {}, timeout=60)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])


def test_a_stalled_ndblaze_redis_costs_only_its_own_requests(stack: LocalStack) -> None:
    s = admin_session(stack.data_dir)
    blaze_read = f"{stack.url}/v1/blaze/cutout/stall/e/img/0/0:64/0:64/0:8/"
    chunk = f"{stack.url}/zarr/stall/e/img/0/c/0/0/0/0"
    with paused(_server(stack, stack.blaze_redis_port)), ThreadPoolExecutor(2 * BURST) as pool:
        burst = [pool.submit(_timed, _get(blaze_read, headers={**OCTET, **s.headers})) for _ in range(BURST)]
        chunks = [pool.submit(_timed, _get(chunk)) for _ in range(BURST)]
        time.sleep(0.5)  # the burst holds the worker's threads
        _unaffected(stack, s, [f"{stack.url}/v1/collection/",
                               f"{stack.url}/v1/cutout/stall/e/other/0/0:64/0:64/0:8/"])
        _healthz_names(stack, "blaze_redis")
        _check_burst(burst, {503}, "NDBlaze")
        # a standard view serves what /v1/cutout/ serves while the buffer cannot say what is pending
        _check_burst(chunks, {200}, "NDBlaze")
    _all_well(stack)


def test_a_stalled_cache_redis_costs_only_its_own_requests(stack: LocalStack) -> None:
    s = admin_session(stack.data_dir)
    cutout = f"{stack.url}/v1/cutout/stall/e/img/0/0:64/0:64/0:8/"
    with paused(_server(stack, stack.redis_port)), ThreadPoolExecutor(BURST) as pool:
        burst = [pool.submit(_timed, _get(cutout, headers={**OCTET, **s.headers})) for _ in range(BURST)]
        time.sleep(0.5)
        # resources come from the metadata database; the metadata generation's Redis is the stalled
        # one, so lookups skip the per-process cache
        _unaffected(stack, s, [f"{stack.url}/v1/collection/", f"{stack.url}/v1/collection/stall/experiment/e/"])
        _healthz_names(stack, "cache_redis")
        _check_burst(burst, {503}, "cache")
    _all_well(stack)


def test_a_stalled_metadata_database_costs_only_its_own_requests(
        stack: LocalStack, database: tuple[StallingRelay, str]) -> None:
    relay = database[0]
    public = f"{stack.url}/v1/cutout/stall/e/img/0/0:64/0:64/0:8/"
    assert requests.get(public, headers=OCTET, timeout=60).status_code == 200  # its lookups are cached now
    s = admin_session(stack.data_dir)
    with relay.stalled(), ThreadPoolExecutor(BURST) as pool:
        burst = [pool.submit(_timed, _get(f"{stack.url}/v1/collection/stall/", headers=dict(s.headers)))
                 for _ in range(BURST)]
        time.sleep(0.5)
        r, took = _timed(_get(public, headers=OCTET))  # anonymous, its channel's lookups cached
        assert r.status_code == 200 and took < FAST_S, (r.status_code, took, r.text[:300])
        _healthz_names(stack, "database")
        _check_burst(burst, {503}, "database")
    _all_well(stack)
