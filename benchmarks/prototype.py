"""The hot path's prototype of DESIGN §8, measured in the same run as the service: the ceiling its
cache-tier goals were set against ("a throw-away prototype of the hot path: plain WSGI + Redis +
blosc2, everything on the same 2 cores").

A plain WSGI app under gunicorn with the service's worker class, worker count and malloc tuning,
clients straight to it (no front), reading and writing one aligned 16 MiB supercuboid per
request as the service's cache tier stores it: 64 cuboids in one Redis hash, each compressed on
its own (the engine's `compress_cuboid`), decoded into the C-order answer with the engine's
`decode_blobs_region`, the answer blosc-compressed as the service's application/blosc is. What
it leaves out is what the service adds around the same bytes: the front, Django and DRF,
authentication, the budget, locks and residency, digests, the ETag, the request log. It writes
into the Redis it is given, so with the stack's own Redis it pays the same `appendfsync`.

    GET  /<i>       the supercuboid stored at proto:<i>, as application/blosc
    GET  /<i>?cold  the same, first paged in: its object read from a file (as the file base tier
                    keeps it), its cuboids stored at proto:<i>, then answered from them
    POST /<i>       an application/blosc body of a 512x512x64 uint8 supercuboid, stored at proto:<i>
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import redis

from benchmarks.common import ServerProcess, serving
from ndstore.core import wire
from ndstore.core.chunks import (
    compress_cuboid,
    cuboid_boxes,
    decode_blobs_region,
    encode_supercuboid,
    split_supercuboid,
)
from ndstore.core.geometry import Box, grid_for_level
from ndstore.ops.localstack import MALLOC_TUNING, free_port, start_redis
from ndstore.storage import redis_client
from ndstore.storage.redis_cache import FIELDS_PER_COMMAND

REDIS_ENV = "PROTOTYPE_REDIS_URL"
OBJECTS_ENV = "PROTOTYPE_OBJECTS_DIR"  # supercuboid objects for the cold reads: <dir>/<i>
GRID = grid_for_level("anisotropic", 0, 1)  # the service's level-0 grid, as bench_direct and bench_cache use
SHAPE = (GRID.supercuboid[2], GRID.supercuboid[1], GRID.supercuboid[0])  # z, y, x of one supercuboid
BOXES = cuboid_boxes(GRID.cuboid, GRID.cuboids_per_super)
FIELDS = [str(n) for n in range(len(BOXES))]
BLOSC = wire.format_for("application/blosc")


@cache
def _redis() -> redis.Redis:
    return redis_client.connect(os.environ[REDIS_ENV])


def store(client: redis.Redis, i: int, volume: np.ndarray) -> None:
    """Supercuboid ``i`` as the cache tier keeps it: one hash of 64 separately compressed cuboids."""
    _put(client, i, [compress_cuboid(volume[b.slices_zyx()]) for b in BOXES])


def _put(client: redis.Redis, i: int, blobs: list[Any]) -> None:
    """The cuboids in pipelined HSETs of FIELDS_PER_COMMAND, as the cache tier sends them: into a
    Redis with its AOF on, one HSET of all 64 took 3-4 x as long (Redis grows its AOF buffer 1 MiB
    at a time; docs/design/cache-tier.md)."""
    pipe = client.pipeline(transaction=False)
    for at in range(0, len(blobs), FIELDS_PER_COMMAND):
        batch = slice(at, at + FIELDS_PER_COMMAND)
        pipe.hset(f"proto:{i}", mapping=dict(zip(FIELDS[batch], blobs[batch])))
    pipe.execute()


def store_object(directory: Path, i: int, volume: np.ndarray) -> None:
    """Supercuboid ``i`` as the file base tier keeps it (the engine's object format), for cold reads."""
    (directory / str(i)).write_bytes(encode_supercuboid(volume, GRID.cuboid, GRID.cuboids_per_super) or b"")


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    i = int(environ["PATH_INFO"].strip("/") or 0)
    if environ["REQUEST_METHOD"] == "POST":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        store(_redis(), i, BLOSC.decode(body, SHAPE, np.dtype(np.uint8)))
        start_response("201 Created", [("Content-Length", "0")])
        return [b""]
    blobs: list[bytes]
    if environ.get("QUERY_STRING") == "cold":
        _, _, _, views = split_supercuboid((Path(os.environ[OBJECTS_ENV]) / str(i)).read_bytes())
        _put(_redis(), i, views)  # the page-in
        blobs = views  # type: ignore[assignment]
    else:
        blobs = _redis().hmget(f"proto:{i}", FIELDS)  # type: ignore[assignment]
    if any(b is None for b in blobs):
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    out = np.empty(SHAPE, np.uint8)
    decode_blobs_region(dict(enumerate(blobs)), GRID.cuboid, GRID.cuboids_per_super,
                        Box((0, 0, 0), (SHAPE[2], SHAPE[1], SHAPE[0])), out)
    answer = BLOSC.encode(out)
    start_response("200 OK", [("Content-Type", BLOSC.media_type), ("Content-Length", str(len(answer)))])
    return [answer]


@contextmanager
def prototype_server(redis_url: str, objects_dir: Path, workers: int = 2, threads: int = 4) -> Iterator[ServerProcess]:
    """`app` under gunicorn (gthread, ``workers`` x ``threads`` as the stack's web service) on a
    free 127.0.0.1 port; supercuboid 0 must be stored before (the readiness check reads it)."""
    port = free_port()
    env = {**os.environ, **MALLOC_TUNING, REDIS_ENV: redis_url, OBJECTS_ENV: str(objects_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers",
                             str(workers), "--worker-class", "gthread", "--threads", str(threads),
                             "--log-level", "warning", "benchmarks.prototype:app"],
                            cwd=Path(__file__).resolve().parent.parent, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    with serving(proc, f"{base}/0", lambda status: status == 200, "prototype server") as server:
        yield ServerProcess(base, server.pid)


@contextmanager
def memory_redis() -> Iterator[str]:
    """The URL of a redis-server of its own on a free 127.0.0.1 port that keeps nothing on disk
    (no AOF, no snapshots); stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="ndbench-redis-") as tmp:
        port = free_port()
        proc = start_redis(Path(tmp), port, appendonly=False)
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)
