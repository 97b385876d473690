"""Page-ins are not logged to the cache Redis's AOF (they copy what the base tier holds). A Redis
killed and restarted from its AOF then holds of each written supercuboid only what its writes
stored; the first read, write or write-back that needs a forgotten cuboid reads it again from
the base tier. Every acknowledged voxel reads back, from the cache and from the base tier."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import redis

from ndstore.core.geometry import Box
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.volume import make_cutout
from ndstore.ops.localstack import free_port, start_redis
from ndstore.storage.redis_cache import INDEX
from tests.engine.conftest import make_cache_tier, small_channel

CHANNEL = small_channel("uint16", cid=23)
GRID = CHANNEL.grid(0)
CUBOID, SUPER = GRID.cuboid, GRID.supercuboid
PER_SUPER = GRID.cuboid_count
# Partly covers the first two cuboids of supercuboid 0; FAR partly covers its last cuboid only.
NEAR = Box((CUBOID[0] // 2, CUBOID[1] // 2, 1), (CUBOID[0] + CUBOID[0] // 2, CUBOID[1] // 2 + 10, 5))
FAR = Box((SUPER[0] - CUBOID[0] // 2, SUPER[1] - CUBOID[1] // 2, SUPER[2] - 5),
          (SUPER[0] - 10, SUPER[1] - 10, SUPER[2] - 1))


def cut(box: Box) -> object:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


[WRITTEN] = cut(NEAR).plan().names  # type: ignore[attr-defined]


@contextmanager
def forgotten_cuboids(tmp_path: Path) -> Iterator[tuple[CacheTier, np.ndarray]]:
    """A cache tier whose Redis (`appendfsync always`, as `ndstore up` runs it) was SIGKILLed after
    paging in the whole channel and a partial write into supercuboid 0, and restarted from its
    AOF; with every acknowledged voxel of the channel."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(tmp_path / "redis", port)
    try:
        tier = make_cache_tier(tmp_path, url)
        rng = np.random.default_rng(23)
        extent = CHANNEL.extent(0)
        reference = rng.integers(1, 60000, extent.shape_zyx, dtype=np.uint16)
        tier.write_base(cut(extent), reference[np.newaxis])  # type: ignore[arg-type]
        np.testing.assert_array_equal(tier.read(cut(extent))[0], reference)  # type: ignore[arg-type]  # pages in all
        tier.settle()
        assert tier._cache.count() == (len(cut(extent).plan().names), 0)  # type: ignore[attr-defined]
        near = rng.integers(1, 60000, NEAR.shape_zyx, dtype=np.uint16)
        tier.write(cut(NEAR), near[np.newaxis])  # type: ignore[arg-type]
        reference[NEAR.slices_zyx()] = near  # acknowledged

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start_redis(tmp_path / "redis", port)
        tier = make_cache_tier(tmp_path, url)
        # back from the AOF: the written supercuboid, resident and dirty, with only what the write stored
        assert tier._cache.count() == (1, 1)
        forgotten = tier._cache.absent(WRITTEN, range(PER_SUPER))
        assert 0 < len(forgotten) < PER_SUPER and PER_SUPER - 1 in forgotten
        yield tier, reference
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("first", ["small read", "write", "write-back"])
def test_cuboids_a_restart_forgot_are_read_again_from_the_base_tier(tmp_path: Path, first: str) -> None:
    with forgotten_cuboids(tmp_path) as (tier, reference):
        extent = CHANNEL.extent(0)
        if first == "small read":  # lock-free at first; the locked read restores
            np.testing.assert_array_equal(tier.read(cut(FAR))[0], reference[FAR.slices_zyx()])  # type: ignore[arg-type]
        elif first == "write":  # a partly covered cuboid to merge into was forgotten
            far = np.random.default_rng(26).integers(1, 60000, FAR.shape_zyx, dtype=np.uint16)
            tier.write(cut(FAR), far[np.newaxis])  # type: ignore[arg-type]
            reference[FAR.slices_zyx()] = far
        else:
            assert tier.upkeep.flush_all() == 1
            np.testing.assert_array_equal(tier.read_raw(cut(extent))[0], reference)  # type: ignore[arg-type]
        tier.settle()  # a read's restore is stored after its answer
        assert tier._cache.absent(WRITTEN, range(PER_SUPER)) == []  # restored, all of them at once

        np.testing.assert_array_equal(tier.read(cut(extent))[0], reference)  # type: ignore[arg-type]
        tier.upkeep.flush_all()
        np.testing.assert_array_equal(tier.read_raw(cut(extent))[0], reference)  # type: ignore[arg-type]
        assert tier.loss.lost() == {}


def test_restores_racing_reads_writes_and_write_backs(tmp_path: Path) -> None:
    """Readers of the whole supercuboid, a flusher writing it back and a writer into a forgotten
    cuboid, all at once: no read ever sees a forgotten cuboid as anything but its voxels, and
    the writer's last write is what stays, in the cache and the base tier."""
    with forgotten_cuboids(tmp_path) as (tier, reference):
        whole = Box((0, 0, 0), SUPER)
        expected = reference[whole.slices_zyx()]
        stop, failures = threading.Event(), []

        def until_stopped(step: Callable[[], None]) -> None:
            try:
                while not stop.is_set():
                    step()
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                failures.append(exc)

        def read() -> None:
            got = tier.read(cut(whole))[0]  # type: ignore[arg-type]
            far = np.unique(got[FAR.slices_zyx()])
            assert len(far) == 1 or np.array_equal(got[FAR.slices_zyx()], expected[FAR.slices_zyx()]), far[:5]
            got[FAR.slices_zyx()] = expected[FAR.slices_zyx()]
            np.testing.assert_array_equal(got, expected)

        others = [threading.Thread(target=until_stopped, args=(step,)) for step in (read, read, tier.upkeep.flush_all)]
        for t in others:
            t.start()
        try:
            for value in range(1, 9):
                tier.write(cut(FAR), np.full((1, *FAR.shape_zyx), value, np.uint16))  # type: ignore[arg-type]
        finally:
            stop.set()
            for t in others:
                t.join(60)
        assert not failures, failures[0]
        reference[FAR.slices_zyx()] = 8
        np.testing.assert_array_equal(tier.read(cut(CHANNEL.extent(0)))[0], reference)  # type: ignore[arg-type]
        tier.upkeep.flush_all()
        np.testing.assert_array_equal(tier.read_raw(cut(CHANNEL.extent(0)))[0], reference)  # type: ignore[arg-type]
        assert tier.loss.lost() == {}


def test_a_restart_forgets_a_supercuboid_only_paged_in(tmp_path: Path) -> None:
    """Nothing of a page-in reaches the AOF: after a restart the supercuboid is simply not
    resident, and the next read pages it in again."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(tmp_path / "redis", port)
    try:
        tier = make_cache_tier(tmp_path, url)
        data = np.random.default_rng(24).integers(1, 60000, NEAR.shape_zyx, dtype=np.uint16)
        tier.write_base(cut(NEAR), data[np.newaxis])  # type: ignore[arg-type]
        tier.read(cut(Box((0, 0, 0), SUPER)))  # type: ignore[arg-type]
        tier.settle()  # its page-in is stored after the answer
        assert tier._cache.count() == (1, 0)
        aof = b"".join(p.read_bytes() for p in (tmp_path / "redis" / "appendonlydir").glob("*.incr.aof"))
        assert b"ndc:{" not in aof  # no cuboid (the index's access-time touch, ZADD XX, is logged: harmless)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start_redis(tmp_path / "redis", port)
        tier = make_cache_tier(tmp_path, url)
        assert tier._cache.count() == (0, 0)
        np.testing.assert_array_equal(tier.read(cut(NEAR))[0], data)  # type: ignore[arg-type]
    finally:
        proc.kill()
        proc.wait()


def test_a_small_read_writes_nothing_to_the_aof(tmp_path: Path) -> None:
    """The lock-free read's access-time touch is not logged either: a read of resident data adds
    nothing to the AOF (so with `appendfsync always` it does not wait for an fsync)."""
    port = free_port()
    proc = start_redis(tmp_path / "redis", port)
    try:
        tier = make_cache_tier(tmp_path, f"redis://127.0.0.1:{port}/0")
        data = np.random.default_rng(25).integers(1, 60000, NEAR.shape_zyx, dtype=np.uint16)
        tier.write(cut(NEAR), data[np.newaxis])  # type: ignore[arg-type]
        tier.settle()  # the rest of the supercuboid, stored after the write answered, under its lock

        def aof_bytes() -> int:
            return sum(p.stat().st_size for p in (tmp_path / "redis" / "appendonlydir").glob("*.incr.aof"))

        index = redis.Redis(port=port)
        before, written_at = aof_bytes(), float(index.zscore(INDEX, WRITTEN) or 0)
        for _ in range(3):
            np.testing.assert_array_equal(tier.read(cut(NEAR))[0], data)  # type: ignore[arg-type]
        assert aof_bytes() == before
        assert float(index.zscore(INDEX, WRITTEN) or 0) > written_at > 0  # the access time moved, unlogged
    finally:
        proc.kill()
        proc.wait()


def test_a_copy_from_the_base_tier_lands_only_in_its_run_and_never_over_a_write(redis_url: str) -> None:
    """The adapter's side of the run check (ndstore/storage/redis_cache.py, _FILL): a page-in or
    fill carrying another run's mark stores nothing; a fill keeps a cuboid written since it was
    found absent."""
    from ndstore.core.errors import RedisUnverified
    from ndstore.storage import redis_client
    from ndstore.storage.redis_cache import RedisCuboidCache

    redis.Redis.from_url(redis_url).flushdb()
    cache = RedisCuboidCache(redis_client.connect(redis_url))
    cache.start_epoch("run-b", 0)
    with pytest.raises(RedisUnverified, match="restarted without its data"):
        cache.page_in("sc", {0: b"old", 1: b"old"}, 1.0, "run-a")
    assert cache.resident(["sc"]) == [False] and cache.absent("sc", [0, 1]) == [0, 1]
    with pytest.raises(RedisUnverified):
        cache.fill("sc", {0: b"old"}, "run-a")
    assert cache.absent("sc", [0]) == [0]
    cache.put("sc", {0: b"written"}, 2.0, dirty=True)
    cache.fill("sc", {0: b"old", 1: b"clean"}, "run-b")
    assert cache.get_many({"sc": [0, 1]})["sc"] == [b"written", b"clean"]


def test_the_rest_of_a_cold_write_held_across_a_restart_from_the_aof(tmp_path: Path) -> None:
    """A write into a supercuboid not resident answers before the rest of its object is stored
    (unlogged, like a page-in). The cache Redis is SIGKILLed and restarted from its AOF while that
    rest is held back: the write (logged) comes back, the rest is stored or restored from the
    base tier, and every acknowledged voxel reads back, nothing marked lost."""
    from tests.engine.test_page_ins_after_answer import WAIT_S, Gate

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(tmp_path / "redis", port)
    try:
        tier = make_cache_tier(tmp_path, url)
        extent = CHANNEL.extent(0)
        reference = np.random.default_rng(27).integers(1, 60000, extent.shape_zyx, dtype=np.uint16)
        tier.write_base(cut(extent), reference[np.newaxis])  # type: ignore[arg-type]
        gate = Gate(tier, "fill")
        near = np.random.default_rng(28).integers(1, 60000, NEAR.shape_zyx, dtype=np.uint16)
        tier.write(cut(NEAR), near[np.newaxis])  # type: ignore[arg-type]
        reference[NEAR.slices_zyx()] = near  # acknowledged
        assert gate.entered.wait(WAIT_S)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start_redis(tmp_path / "redis", port)
        gate.open()
        tier.settle()
        assert tier._cache.count() == (1, 1)
        np.testing.assert_array_equal(tier.read(cut(extent))[0], reference)  # type: ignore[arg-type]
        tier.upkeep.flush_all()
        np.testing.assert_array_equal(tier.read_raw(cut(extent))[0], reference)  # type: ignore[arg-type]
        assert tier.loss.lost() == {}
    finally:
        proc.kill()
        proc.wait()
