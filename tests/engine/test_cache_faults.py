"""Many processes on the cache tier at once, and a Redis server killed mid-flight."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import redis

from ndstore.core.geometry import Box
from ndstore.engine.volume import make_cutout
from ndstore.ops.localstack import free_port, start_redis
from tests.engine.conftest import make_cache_tier, small_channel

CHANNEL = small_channel("uint16", cid=21)
# One box over all four supercuboids of z-slab 0: a torn read would mix two writers' values.
SHARED = Box((300, 300, 2), (800, 700, 9))
ROUNDS = 8


def cut(box: Box) -> object:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


def worker(root: str, url: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    tier = make_cache_tier(Path(root), url)
    seen = set()
    for r in range(ROUNDS):
        value = n * 1000 + r + 1
        tier.write(cut(SHARED), np.full((1, *SHARED.shape_zyx), value, np.uint16))  # type: ignore[arg-type]
        got = tier.read(cut(SHARED))  # type: ignore[arg-type]
        values = np.unique(got)
        assert len(values) == 1, f"torn read: {values[:5]}"
        seen.add(int(values[0]))
    out.put((n, sorted(seen)))


def test_concurrent_processes_never_see_torn_boxes(tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    make_cache_tier(tmp_path, redis_url)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(str(tmp_path), redis_url, n, out)) for n in range(4)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 4 and len(results) == 4
    tier = make_cache_tier(tmp_path, redis_url)
    final = np.unique(tier.read(cut(SHARED)))  # type: ignore[arg-type]
    assert len(final) == 1 and int(final[0]) % 1000 == ROUNDS  # some writer's last write won, whole
    tier.upkeep.flush_all()
    np.testing.assert_array_equal(tier._base.read(cut(SHARED)), tier.read(cut(SHARED)))  # type: ignore[arg-type]


# `everysec` is not here: it may lose a write acknowledged while a background fsync ran (Redis
# postpones the AOF write behind it); tests/faults/test_redis_aof_fsync.py shows it as a strict
# xfail. It passed here most runs and failed in CI once (a write's cuboids read back as zeros).
@pytest.mark.parametrize("appendfsync", ["always"])
def test_acknowledged_writes_survive_redis_sigkill(tmp_path: Path, appendfsync: str) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(tmp_path / "redis", port, appendfsync=appendfsync)
    try:
        tier = make_cache_tier(tmp_path, url)
        rng = np.random.default_rng(4)
        extent = CHANNEL.extent(0)
        reference = np.zeros(extent.shape_zyx, np.uint16)
        for i in range(6):
            box = Box((100 * i, 50 * i, i), (100 * i + 90, 50 * i + 300, i + 5))
            data = rng.integers(1, 60000, box.shape_zyx, dtype=np.uint16)
            tier.write(cut(box), data[np.newaxis])  # type: ignore[arg-type]
            reference[box.slices_zyx()] = data  # acknowledged
        # The rest of a supercuboid a write paged in is stored after the write answered, under its
        # lock; a kill in the middle leaves that lock in the AOF until its lease runs out (30 s of
        # waiting, then the read goes on). What this test checks is the acknowledged writes.
        tier.settle()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start_redis(tmp_path / "redis", port, appendfsync=appendfsync)
        tier = make_cache_tier(tmp_path, url)
        assert tier._cache.count()[1] > 0  # the dirty data came back from the AOF, not from the base tier
        np.testing.assert_array_equal(tier.read(cut(extent))[0], reference)  # type: ignore[arg-type]
        tier.upkeep.flush_all()
    finally:
        proc.kill()
        proc.wait()
