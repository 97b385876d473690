"""`GET /healthz` on a live stack while its redis-servers fail, the way a load balancer probes it:
no token, its own Host header.

The cache and lock redis-server is SIGKILLed (a crash: connections refused) and started again with
its command line, as a supervisor would; the NDBlaze redis-server is first SIGSTOPped (a hung
server: it accepts connections and never answers, so the probe must give up on its own timeout
rather than hang the load balancer's probe) and resumed, then SIGKILLed and started again. Each
time /healthz answers 503 within seconds (it reuses an answer for a second; a hung server adds the
probe's 2 s timeout), JSON naming exactly the parts that fail, the others "ok"; and 200 again once
the server is back, with nothing else restarted.

Everything binds 127.0.0.1.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
import requests

from ndstore.core.geometry import Box
from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.faults.conftest import LEASE_MS, TOKEN, Stack, wait_for

pytestmark = pytest.mark.faults

PARTS = {"database", "cache_redis", "lock_redis", "blaze_redis", "object_store", "index", "label_index"}
# The stack's cache and locks share one redis-server (NDSTORE_CACHE_REDIS_URL unset): both fail.
CACHE_SERVER_PARTS = {"cache_redis", "lock_redis"}
DETECT_S = 10.0  # the first 503 after a fault (answers live 1 s)
# the first 200 when every part answers: each probe of a part must answer within 0.8 s, which a
# machine under a load spike of another test (a software-rendering browser) misses for seconds
RECOVER_S = 30.0
PROBE_S = 5.0  # the longest one /healthz may take: a hung server costs the probe's 2 s timeout
FOREIGN_HOST = "lb-probe.internal"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {
        "NDSTORE_ADMIN_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base",
        "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_LOCKS": "redis",
        "NDSTORE_LOCK_LEASE_MS": str(LEASE_MS), "NDSTORE_FLUSH_AGE_S": "0.2", "NDSTORE_FLUSH_INTERVAL_S": "0.2",
        "NDSTORE_INGEST_WORKERS": "1", "GUNICORN_CMD_ARGS": "--log-level warning",
        # host validation on (base settings allow any Host by default): /healthz must not need it
        "NDSTORE_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    local = LocalStack(tmp_path_factory.mktemp("health-stack"), port=free_port(), workers=1, threads=4,
                       extra_env=own_stack_env(env), with_merger=False, with_runner=False)
    local.start()
    try:
        # the first request of a freshly started worker loads the app (5.5 s once on a loaded CI
        # host): PROBE_S bounds a running service's probe, so that one is not timed
        requests.get(f"{local.url}/healthz", timeout=60)
        yield Stack(local, None, env)  # type: ignore[arg-type]  # no proxy: no AWS endpoint in this stack
    finally:
        for proc in local.procs:  # a server left stopped by a failed test would ignore SIGTERM
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        local.stop()


def healthz(stack: Stack, host: str | None = None) -> tuple[int, dict[str, Any], float]:
    """(status, JSON body, seconds) of one probe: no token; `host` as the Host header."""
    started = time.monotonic()
    r = requests.get(f"{stack.url}/healthz", headers={"Host": host} if host else {}, timeout=30)
    took = time.monotonic() - started
    assert r.headers.get("Content-Type", "").startswith("application/json"), (r.status_code, r.text[:300])
    assert took < PROBE_S, f"/healthz took {took:.1f}s"
    body: dict[str, Any] = r.json()
    return r.status_code, body, took


def failing(stack: Stack, parts: set[str]) -> None:
    """Until /healthz answers 503; then its body must name exactly `parts` as failing."""
    since = time.monotonic()
    status, body, _ = wait_for(lambda: (a := healthz(stack))[0] != 200 and a, f"/healthz failing {sorted(parts)}",
                               DETECT_S, 0.1)
    print(f"503 after {time.monotonic() - since:.2f}s: {body}")
    assert status == 503 and body["status"] == "failing", body
    assert {name for name, state in body["parts"].items() if state != "ok"} == parts, body
    assert all(body["parts"][name] == "ok" for name in PARTS - parts), body
    for name in parts:
        assert name in body["message"], body["message"]


def healthy(stack: Stack) -> float:
    """Until /healthz answers 200 with every part ok; how long that took."""
    since = time.monotonic()
    status, body, _ = wait_for(lambda: (a := healthz(stack))[0] == 200 and a, "/healthz 200", RECOVER_S, 0.1)
    assert body["status"] == "ok" and set(body["parts"]) >= PARTS, body
    assert all(state == "ok" for state in body["parts"].values()), body
    return time.monotonic() - since


def redis_server(stack: Stack, port: int) -> subprocess.Popen[bytes]:
    [proc] = [p for p in stack.local.procs if isinstance(p.args, list) and str(p.args[0]).endswith("redis-server")
              and str(port) in p.args]
    return proc


def start_again(stack: Stack, old: subprocess.Popen[bytes], port: int) -> None:
    """Start a killed redis-server again with its command line (the same data and settings);
    the fixture stops the new one."""
    new = subprocess.Popen(old.args, stdout=subprocess.DEVNULL)
    stack.local.procs[stack.local.procs.index(old)] = new
    wait_for(lambda: _pings(port), f"redis-server on {port} again", 30, 0.1)


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def daemons(stack: Stack) -> list[int]:
    return [p.pid for p in stack.local.procs if isinstance(p.args, list) and "daemons" in p.args and p.poll() is None]


def test_healthz_names_the_failing_redis_and_recovers_without_a_restart(live: Stack) -> None:
    started = time.monotonic()
    healthy(live)
    status, body, took = healthz(live)
    print(f"/healthz parts ({took * 1000:.0f} ms): {body['parts']}")
    assert set(body["parts"]) >= PARTS, body

    # a load balancer's probe: no token, its own Host; the host check itself is on. What is
    # asserted is that the probe is answered (200, or 503 where a loaded machine's part was slow)
    foreign = healthz(live, FOREIGN_HOST)
    assert foreign[0] in (200, 503) and set(foreign[1]["parts"]) >= PARTS, foreign
    assert requests.head(f"{live.url}/healthz", headers={"Host": FOREIGN_HOST}, timeout=30).status_code in (200, 503)
    assert requests.get(f"{live.url}/v1/collection/", headers={"Host": FOREIGN_HOST}, timeout=30).status_code == 400
    assert live.session().get(f"{live.url}/v1/collection/", timeout=30).status_code == 200

    workers, running = live.web_workers(), daemons(live)
    assert workers and running

    # the cache and lock redis-server crashes, and is started again
    port = live.local.redis_port
    server = redis_server(live, port)
    server.send_signal(signal.SIGKILL)
    server.wait()
    failing(live, CACHE_SERVER_PARTS)
    status, _, _ = healthz(live, FOREIGN_HOST)
    assert status == 503
    start_again(live, server, port)
    print(f"200 again {healthy(live):.2f}s after the cache redis-server was back")

    # the NDBlaze redis-server hangs (SIGSTOP): each probe gives up on its own timeout
    port = live.local.blaze_redis_port
    server = redis_server(live, port)
    server.send_signal(signal.SIGSTOP)
    try:
        failing(live, {"blaze_redis"})
    finally:
        server.send_signal(signal.SIGCONT)
    print(f"200 again {healthy(live):.2f}s after the NDBlaze redis-server resumed")

    # ... then crashes, and is started again; meanwhile a viewer still reads (what /v1/cutout/ reads)
    viewed = live.channel("viewed", (128, 128, 16))
    box = Box((0, 0, 0), (64, 64, 16))
    shown = np.full(box.shape_zyx, 5, np.uint8)
    assert viewed.write(box, shown).status_code == 201
    server.send_signal(signal.SIGKILL)
    server.wait()
    failing(live, {"blaze_redis"})
    chunk = live.session().get(f"{live.url}/precomputed/viewed/e/c/0/0-64_0-64_0-16", timeout=30)
    assert chunk.status_code == 200 and chunk.content == shown.tobytes(), chunk.text[:200]
    start_again(live, server, port)
    print(f"200 again {healthy(live):.2f}s after the NDBlaze redis-server was back")

    # nothing else was restarted, and the stack serves again
    assert live.web_workers() == workers
    assert daemons(live) == running
    channel = live.channel("health", (512, 512, 16))
    box, data = Box((0, 0, 0), (64, 64, 8)), np.arange(64 * 64 * 8, dtype=np.uint32).astype(np.uint8).reshape(8, 64, 64)
    assert channel.write(box, data, "direct/cutout").status_code == 201
    np.testing.assert_array_equal(channel.read_ok(box), data)
    data[2:5] = 7
    assert channel.write(box, data).status_code == 201  # the restarted cache Redis takes writes
    live.wait_written_back(DETECT_S)
    for path, mode in (("cutout", None), ("direct/cutout", None), ("cutout", "raw")):
        np.testing.assert_array_equal(channel.read_ok(box, path, mode), data)
    print(f"test took {time.monotonic() - started:.1f}s")
