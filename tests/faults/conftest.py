"""Fault-suite fixtures: the fault-injecting proxy in front of the session's moto endpoint, and
one live stack (`ndstore.ops.localstack.LocalStack`: redis-servers with AOF `appendfsync
always`, gunicorn, the flusher and cache manager daemons, the ingest runner) whose base tier
(S3 + DynamoDB) and ingest endpoint (S3, SQS, DynamoDB) are reached through that proxy; helpers
for channels, cutouts and the checks. Short settings keep the suite quick: lock leases of 3 s, a
flusher that writes back after 0.2 s, a 2 s AWS timeout, a 3 s SQS visibility timeout, cache
watermarks of 64/32 MiB.

Every server binds 127.0.0.1 and is stopped by the fixture that started it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import redis
import requests

from ndstore.core.geometry import Box
from ndstore.ops.localstack import LocalStack, free_port, wait_until
from tests.conftest import own_stack_env
from tests.faults.proxy import FaultProxy

TOKEN = "faults-admin-token"
MiB = 1 << 20
LEASE_MS = 3000
OCTET = "application/octet-stream"


@pytest.fixture(scope="package")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    server = FaultProxy(moto_endpoint, seed=7).start()
    yield server
    server.stop()


def _pids(pattern: str) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process whose command line holds `pattern`."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if pattern in cmd:
            out[int(entry.name)] = (ppid, cmd)
    return out


@dataclass
class Stack:
    local: LocalStack
    proxy: FaultProxy
    env: dict[str, str]

    @property
    def url(self) -> str:
        return self.local.url

    def session(self) -> requests.Session:
        s = requests.Session()
        s.headers["Authorization"] = f"Token {TOKEN}"
        return s

    def redis(self) -> redis.Redis:
        """The cache tier's (and the locks') redis-server."""
        return redis.Redis(port=self.local.redis_port)

    def child_pids(self, parent_pattern: str, child_pattern: str = "") -> list[int]:
        """Processes started by the stack's process whose command line holds `parent_pattern`
        (gunicorn's workers, the ingest runner's worker processes)."""
        parents = {p.pid for p in self.local.procs if parent_pattern in " ".join(_cmdline(p.pid))}
        return sorted(pid for pid, (ppid, cmd) in _pids(child_pattern).items() if ppid in parents)

    def web_workers(self) -> list[int]:
        return self.child_pids("gunicorn")

    def channel(self, collection: str, frame: tuple[int, int, int], dtype: str = "uint8") -> Channel:
        """A coordinate frame, collection, experiment `e` and channel `c` (each answered 201)."""
        s, url = self.session(), f"{self.url}/v1"
        x, y, z = frame
        steps: tuple[tuple[str, dict[str, Any]], ...] = (
            (f"coord/{collection}_f/", {"x_stop": x, "y_stop": y, "z_stop": z}),
            (f"collection/{collection}/", {}),
            (f"collection/{collection}/experiment/e/", {"coord_frame": f"{collection}_f", "num_hierarchy_levels": 1}),
            (f"collection/{collection}/experiment/e/channel/c/", {"datatype": dtype}),
        )
        for path, body in steps:
            r = s.post(f"{url}/{path}", json=body)
            assert r.status_code == 201, r.text
        return Channel(self, collection, np.dtype(dtype), Box((0, 0, 0), frame))

    def wait_written_back(self, timeout: float = 60) -> None:
        """Until the flusher has written every dirty supercuboid back to the base tier."""
        client = self.redis()
        wait_until(lambda: client.zcard("ndc:dirty") == 0, "the write-back of every dirty supercuboid", timeout)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


@dataclass
class Channel:
    stack: Stack
    collection: str
    dtype: np.dtype
    frame: Box

    def url(self, box: Box, path: str = "cutout", mode: str | None = None) -> str:
        (x0, y0, z0), (x1, y1, z1) = box.lo, box.hi
        query = f"?access-mode={mode}" if mode else ""
        return f"{self.stack.url}/v1/{path}/{self.collection}/e/c/0/{x0}:{x1}/{y0}:{y1}/{z0}:{z1}/{query}"

    def write(self, box: Box, data: npt.NDArray[Any], path: str = "cutout",
              session: requests.Session | None = None) -> requests.Response:
        assert data.shape == box.shape_zyx and data.dtype == self.dtype
        s = session or self.stack.session()
        return s.post(self.url(box, path), data=data.tobytes(), headers={"Content-Type": OCTET}, timeout=120)

    def read(self, box: Box, path: str = "cutout", mode: str | None = None,
             session: requests.Session | None = None) -> tuple[int, npt.NDArray[Any] | None, str]:
        """(status, the array on a 200, the error message otherwise)."""
        s = session or self.stack.session()
        r = s.get(self.url(box, path, mode), headers={"Accept": OCTET}, timeout=120)
        if r.status_code == 200:
            return 200, np.frombuffer(r.content, self.dtype).reshape(box.shape_zyx), ""
        return r.status_code, None, error_message(r)

    def read_ok(self, box: Box, path: str = "cutout", mode: str | None = None) -> npt.NDArray[Any]:
        status, data, message = self.read(box, path, mode)
        assert status == 200 and data is not None, (status, message)
        return data


def error_message(r: requests.Response) -> str:
    """The message of an error answer, checked to be the service's JSON error body."""
    body = r.json()
    assert set(body) >= {"status", "message"} and body["message"], body  # errors always name the problem
    return str(body["message"])


@pytest.fixture(scope="package")
def stack(proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    suffix = uuid.uuid4().hex[:8]
    env = {
        "NDSTORE_ADMIN_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base",
        "NDSTORE_OBJECT_STORE": "s3", "NDSTORE_S3_ENDPOINT_URL": proxy.url, "NDSTORE_S3_BUCKET": f"faults-{suffix}",
        "NDSTORE_INDEX": "dynamodb", "NDSTORE_DYNAMODB_ENDPOINT_URL": proxy.url,
        "NDSTORE_DYNAMODB_TABLE": f"faults-{suffix}", "NDSTORE_LOCKS": "redis",
        "NDSTORE_AWS_TIMEOUT_S": "2", "NDSTORE_LOCK_LEASE_MS": str(LEASE_MS),
        "NDSTORE_FLUSH_AGE_S": "0.2", "NDSTORE_FLUSH_INTERVAL_S": "0.2",
        "NDSTORE_CACHE_HIGH_BYTES": str(64 * MiB), "NDSTORE_CACHE_LOW_BYTES": str(32 * MiB),
        "NDSTORE_MAX_BODY_BYTES": str(256 * MiB), "NDSTORE_MAX_CUTOUT_BYTES": str(256 * MiB),
        "NDSTORE_INGEST_ENDPOINT_URL": proxy.url, "NDSTORE_TILE_BUCKET": f"faults-tiles-{suffix}",
        "NDSTORE_TILE_INDEX_TABLE": f"faults-tiles-{suffix}", "NDSTORE_INGEST_QUEUE_PREFIX": f"faults-{suffix}",
        "NDSTORE_INGEST_VISIBILITY_S": "3", "NDSTORE_INGEST_WORKERS": "1", "NDSTORE_INGEST_MAX_TRIES": "5",
        "GUNICORN_CMD_ARGS": "--log-level warning",
    }
    local = LocalStack(tmp_path_factory.mktemp("faults-stack"), port=free_port(), workers=1, threads=4,
                       extra_env=own_stack_env(env), with_merger=False)
    # Both redis-servers fsync each write before acknowledging it: with `everysec` a SIGKILL can
    # lose acknowledged writes (test_redis_aof_fsync.py), which the Redis kill test would hit now and then.
    saved = os.environ.get("NDSTORE_REDIS_APPENDFSYNC")
    os.environ["NDSTORE_REDIS_APPENDFSYNC"] = "always"
    try:
        local.start()
    finally:
        if saved is None:
            os.environ.pop("NDSTORE_REDIS_APPENDFSYNC")
        else:
            os.environ["NDSTORE_REDIS_APPENDFSYNC"] = saved
    try:
        yield Stack(local, proxy, env)
    finally:
        local.stop()


def wait_for(check: Any, what: str, timeout: float = 60, every: float = 0.05) -> Any:
    """Poll `check()` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout}s")


# --- references and checks ------------------------------------------------------------------


def random_box(rng: np.random.Generator, frame: Box, most: tuple[int, int, int],
               least: tuple[int, int, int] = (1, 1, 1)) -> Box:
    """A box inside `frame`, at least `least` and at most `most` (x, y, z) voxels large."""
    size = [int(rng.integers(least[a], min(m, frame.hi[a] - frame.lo[a]) + 1)) for a, m in enumerate(most)]
    lo = [int(rng.integers(frame.lo[a], frame.hi[a] - size[a] + 1)) for a in range(3)]
    return Box((lo[0], lo[1], lo[2]), (lo[0] + size[0], lo[1] + size[1], lo[2] + size[2]))


def supercuboid_parts(box: Box, dtype: np.dtype) -> list[tuple[int, tuple[slice, slice, slice]]]:
    """(Morton code, slices of the box's array) of every supercuboid the box touches."""
    from ndstore.core.geometry import grid_for_level, plan_supercuboids

    return [(p.morton, p.in_box(box)) for p in plan_supercuboids(box, grid_for_level("anisotropic", 0, dtype.itemsize))]


def whole_or_nothing(got: npt.NDArray[Any], old: npt.NDArray[Any], new: npt.NDArray[Any], box: Box) -> list[str]:
    """Which of `old` and `new` each supercuboid of `box` holds; fails on a supercuboid that holds
    a mix of the two (or anything else): a torn write."""
    kinds = []
    for morton, part in supercuboid_parts(box, got.dtype):
        if np.array_equal(got[part], new[part]):
            kinds.append("new")
        elif np.array_equal(got[part], old[part]):
            kinds.append("old")
        else:
            mixed = int(np.count_nonzero(got[part] != new[part])), int(np.count_nonzero(got[part] != old[part]))
            raise AssertionError(f"supercuboid {morton} of {box} is torn: {mixed[0]} voxels differ from the new "
                                 f"data and {mixed[1]} from the old")
    return kinds


def stored_objects_are_indexed(stack: Stack, moto_endpoint: str) -> int:
    """Every base-tier supercuboid object has its index entry (the index is a superset: put goes index
    first, delete object first); read straight from moto, not through the proxy. Returns the
    number of objects."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    db = boto3.client("dynamodb", endpoint_url=moto_endpoint)
    keys = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=stack.env["NDSTORE_S3_BUCKET"])
            for o in page.get("Contents", []) if not o["Key"].startswith("_ndstore-")}  # ledgers and marks
    indexed = {item["object_key"]["S"] for page in db.get_paginator("scan").paginate(
        TableName=stack.env["NDSTORE_DYNAMODB_TABLE"]) for item in page["Items"]}
    assert keys <= indexed, f"objects without an index entry: {sorted(keys - indexed)[:5]}"
    return len(keys)


@pytest.fixture
def fresh_web_worker(stack: Stack) -> int:
    """A web worker started for this test (gunicorn reloads its workers on SIGHUP). Its boto3
    clients start with a full retry quota: botocore's standard retry mode stops retrying once a
    client has spent its quota on failures (an earlier test's outage) and earns it back slowly, so
    whether a lone transient fault is retried away depends on the worker's history otherwise."""
    master = next(p.pid for p in stack.local.procs if "gunicorn" in " ".join(_cmdline(p.pid)))
    old = set(stack.web_workers())
    os.kill(master, signal.SIGHUP)
    pids = wait_for(lambda: (w := stack.web_workers()) and not old & set(w) and w, "gunicorn's new worker", 60)
    session = stack.session()
    wait_until(lambda: session.get(f"{stack.url}/v1/collection/", timeout=5).status_code == 200, "the new worker")
    return int(pids[0])
