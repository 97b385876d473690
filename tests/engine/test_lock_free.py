"""Small reads and writes go without locks: a read is one atomic snapshot, a write commits only if
nothing it read changed (CacheTier, RedisCuboidCache.read_unlocked, read_for_update, commit_unlocked)
and fall back to the locked read whenever it would not be safe: a writer holds the lock, the
supercuboid is not resident, is marked lost, is damaged, or the Redis is not checked. On the Redis
cache (round trips, the Redis left as it was by a refused commit, other processes' locks) and, for
what the engine itself decides, on the in-memory cache with its lock-free commits too."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from ndstore.core.chunks import compress_cuboid, cuboid_boxes
from ndstore.core.errors import DataLost, RedisUnverified
from ndstore.core.geometry import Box
from ndstore.engine.cache import parts
from ndstore.engine.cache.lock_free import LOCK_FREE_MERGE_CUBOIDS, LOCK_FREE_WRITE_BYTES, SNAPSHOT_CUBOIDS
from ndstore.engine.cache.parts import touching
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.volume import make_cutout
from ndstore.storage import redis_client
from ndstore.storage.redis_cache import EPOCH, RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks
from tests.engine.conftest import make_cache_tier, small_channel
from tests.round_trips import RoundTrips

CHANNEL = small_channel("uint8", cid=41)
GRID = CHANNEL.grid(0)
SC, CUBOID = GRID.supercuboid, GRID.cuboid
WHOLE = Box((0, 0, 0), SC)
SMALL = Box((3, 5, 1), (CUBOID[0] + 9, 17, 2))  # two cuboids of one supercuboid


def cut(box: Box) -> Any:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


def values(box: Box, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, (1, *box.shape_zyx), np.uint8)


def test_a_resident_read_of_up_to_a_supercuboid_is_one_round_trip_and_a_larger_one_takes_locks(
        cache_tier: CacheTier, monkeypatch: pytest.MonkeyPatch) -> None:
    two = Box((0, 0, 0), (2 * SC[0], SC[1], SC[2]))  # two supercuboids' cuboids: more than SNAPSHOT_CUBOIDS
    data = values(two, 1)
    cache_tier.write(cut(two), data)
    cache_tier.read(cut(SMALL))  # Redis has loaded the script (a first call sends it)
    trips = RoundTrips(monkeypatch)

    sent, got = trips.during(lambda: cache_tier.read(cut(SMALL)))  # decoded in the request's thread
    assert sent == 1
    np.testing.assert_array_equal(got, data[0][SMALL.slices_zyx()][None])

    assert GRID.cuboid_count == SNAPSHOT_CUBOIDS  # a whole supercuboid, decoded on the codec pool
    sent, got = trips.during(lambda: cache_tier.read(cut(WHOLE)))
    assert sent == 1
    np.testing.assert_array_equal(got, data[0][WHOLE.slices_zyx()][None])

    sent, got = trips.during(lambda: cache_tier.read(cut(two)))
    assert sent >= 5  # guard, locks, residency, cuboids, release, touch
    np.testing.assert_array_equal(got, data)


def test_a_small_read_waits_for_a_writer_that_holds_its_lock(cache_tier: CacheTier, redis_url: str) -> None:
    cache_tier.write(cut(WHOLE), values(WHOLE, 2))
    other_process = RedisRWLocks(redis_client.connect(redis_url), timeout_s=30)
    (name,) = cut(SMALL).plan().names
    new = values(WHOLE, 3)[0]
    boxes = cuboid_boxes(CUBOID, GRID.cuboids_per_super)
    result: list[np.ndarray] = []
    with other_process.write([name]):  # a writer between its steps: it changes two cuboids
        reader = threading.Thread(target=lambda: result.append(cache_tier.read(cut(SMALL))))
        reader.start()
        time.sleep(0.5)
        assert reader.is_alive() and not result  # no snapshot while a writer holds the lock
        RedisCuboidCache(redis_client.connect(redis_url)).put(
            name, {n: compress_cuboid(new[boxes[n].slices_zyx()]) for n in (0, 1)}, time.time(), dirty=True)
    reader.join(10)
    assert result
    np.testing.assert_array_equal(result[0][0], new[SMALL.slices_zyx()])


def test_a_small_read_sees_a_write_that_finished_before_it(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    cache_tier.write(cut(WHOLE), values(WHOLE, 4))
    for seed in range(5, 10):
        cache_tier.write(cut(SMALL), values(SMALL, seed))
        np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), values(SMALL, seed))


def test_a_damaged_cuboid_met_by_a_small_read_is_paged_in_again(cache_tier: CacheTier, redis_url: str) -> None:
    data = values(WHOLE, 11)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.upkeep.flush_all()  # clean: the base tier holds it, the cached copy may be dropped
    (name,) = cut(SMALL).plan().names
    client = redis.Redis.from_url(redis_url)
    blob = bytearray(client.hget(f"ndc:{{{name}}}", "0") or b"")
    blob[len(blob) // 2] ^= 0xFF
    client.hset(f"ndc:{{{name}}}", "0", bytes(blob))
    np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), data[0][SMALL.slices_zyx()][None])


def test_a_small_read_of_a_lost_supercuboid_is_refused(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    cache_tier.write(cut(WHOLE), values(WHOLE, 12))
    (name,) = cut(SMALL).plan().names
    cache_tier._cache.mark_lost({name: "test: gone"})  # as another process finds it
    with pytest.raises(DataLost) as refused:
        cache_tier.read(cut(SMALL))
    assert refused.value.names == [name]


def test_a_small_read_in_an_unchecked_redis_checks_it_first(cache_tier: CacheTier, redis_url: str) -> None:
    data = values(WHOLE, 13)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.upkeep.flush_all()
    client = redis.Redis.from_url(redis_url)
    client.delete(EPOCH)  # as a Redis that restarted: its holdings unchecked
    cache_before = cache_tier.loss.verify
    checked: list[bool] = []
    cache_tier.loss.verify = lambda: checked.append(True) or cache_before()  # type: ignore[method-assign]
    got = cache_tier.read(cut(SMALL))
    assert checked and client.exists(EPOCH)
    np.testing.assert_array_equal(got, data[0][SMALL.slices_zyx()][None])


def test_a_small_read_of_a_missing_supercuboid_pages_it_in(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    data = values(WHOLE, 14)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.upkeep.flush_all()
    (name,) = cut(SMALL).plan().names
    with cache_tier.exclusive([name]):  # written back and dropped
        pass
    np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), data[0][SMALL.slices_zyx()][None])


# -- small writes: optimistic, committed only if nothing they read changed ----------------------
def test_a_small_resident_write_is_two_round_trips(cache_tier: CacheTier, monkeypatch: pytest.MonkeyPatch) -> None:
    data = values(WHOLE, 21)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.write(cut(SMALL), values(SMALL, 22))  # Redis has loaded the scripts
    trips = RoundTrips(monkeypatch)
    sent, _ = trips.during(lambda: cache_tier.write(cut(SMALL), values(SMALL, 23)))
    assert sent == 2  # the snapshot of the partly covered cuboids, the conditional commit
    data[0][SMALL.slices_zyx()] = values(SMALL, 23)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)
    assert cache_tier.upkeep.flush_all() and np.array_equal(cache_tier._base.read(cut(WHOLE)), data)


def test_a_write_of_up_to_16_partly_covered_cuboids_is_two_round_trips(cache_tier: CacheTier,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to LOCK_FREE_MERGE_CUBOIDS partly covered cuboids (16: since a commit no longer copies
    its cuboids into Lua, a write of 16 is faster lock-free; docs/design/serving.md, "Which
    requests go without locks"); one with more takes locks."""
    data = values(WHOLE, 35)
    cache_tier.write(cut(WHOLE), data)
    sixteen = Box((30, 30, 8), (30 + 3 * CUBOID[0] + 10, 30 + CUBOID[1] + 10, 8 + CUBOID[2]))  # 4 x 2 x 2
    seventeen_plus = Box((30, 30, 8), (30 + 3 * CUBOID[0] + 10, 30 + 2 * CUBOID[1] + 10, 8 + CUBOID[2]))  # 4 x 3 x 2
    trips = RoundTrips(monkeypatch)
    for box, seed, lock_free in ((sixteen, 36, True), (seventeen_plus, 37, False)):
        assert sum(len(touching(p.part, GRID)) for p in cut(box).plan().parts) == (16 if lock_free else 24)
        sent, _ = trips.during(lambda b=box, s=seed: cache_tier.write(cut(b), values(b, s)))
        assert (sent == 2) == lock_free, sent
        data[0][box.slices_zyx()] = values(box, seed)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)
    assert cache_tier.upkeep.flush_all() and np.array_equal(cache_tier._base.read(cut(WHOLE)), data)


def test_a_stroke_is_merged_in_the_request_thread_and_a_larger_write_on_the_codec_pool(
        any_cache_tier: CacheTier, monkeypatch: pytest.MonkeyPatch) -> None:
    """Merges of up to SERIAL_MERGE_CUBOIDS partly covered cuboids (the most a 64x64x8 stroke
    touches) run in the caller's thread: the pool's hand-offs cost more CPU than they save
    (docs/design/serving.md, "Work in the request's thread"); more go to the codec pool. Either
    way every voxel lands."""
    cache_tier = any_cache_tier
    data = values(WHOLE, 51)
    cache_tier.write(cut(WHOLE), data)
    stroke = Box((CUBOID[0] - 30, CUBOID[1] - 30, CUBOID[2] - 4), (CUBOID[0] + 34, CUBOID[1] + 34, CUBOID[2] + 4))
    sixteen = Box((30, 30, 8), (30 + 3 * CUBOID[0] + 10, 30 + CUBOID[1] + 10, 8 + CUBOID[2]))  # 4 x 2 x 2
    threads: list[int] = []
    real_compress = parts.compress_cuboid
    monkeypatch.setattr(parts, "compress_cuboid", lambda c: threads.append(threading.get_ident()) or real_compress(c))
    for box, seed, in_caller in ((stroke, 52, True), (sixteen, 53, False)):
        touched = sum(len(touching(p.part, GRID)) for p in cut(box).plan().parts)
        assert (touched <= parts.SERIAL_MERGE_CUBOIDS) == in_caller, touched
        threads.clear()
        cache_tier.write(cut(box), values(box, seed))
        assert len(threads) == touched
        assert (set(threads) == {threading.get_ident()}) == in_caller, threads
        data[0][box.slices_zyx()] = values(box, seed)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)
    assert cache_tier.upkeep.flush_all() and np.array_equal(cache_tier._base.read(cut(WHOLE)), data)


def test_a_supercuboid_of_labels_goes_without_locks_and_of_noise_with_each_cuboid_compressed_once(
        cache_tier: CacheTier, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to LOCK_FREE_WRITE_CUBOIDS whole cuboids go lock-free when their blobs fit
    LOCK_FREE_WRITE_BYTES (labels: a few KiB each); incompressible ones take the locked path,
    which stores the blobs the lock-free try compressed (serving.md, "Which requests go without locks")."""
    data = values(WHOLE, 41)
    cache_tier.write(cut(WHOLE), data)
    half = Box((0, 0, 0), (SC[0], SC[1], SC[2] // 2))  # 4 x 4 x 2 whole cuboids
    assert len(cut(half).plan().parts) == 1 and len(touching(cut(half).plan().parts[0].part, GRID)) == 32
    assert 32 > LOCK_FREE_MERGE_CUBOIDS and 32 * CUBOID[0] * CUBOID[1] * CUBOID[2] > LOCK_FREE_WRITE_BYTES
    labels = np.zeros((1, *half.shape_zyx), np.uint8)
    labels[0, :, 100:300, 50:400] = 7
    compressed: list[int] = []
    real_compress = parts.compress_cuboid
    monkeypatch.setattr(parts, "compress_cuboid", lambda c: compressed.append(1) or real_compress(c))
    trips = RoundTrips(monkeypatch)
    for written, lock_free in ((labels, True), (values(half, 42), False)):
        compressed.clear()
        sent, _ = trips.during(lambda w=written: cache_tier.write(cut(half), w))
        assert (sent == 2) == lock_free, sent  # the snapshot's checks, the conditional commit
        assert len(compressed) == 32
        data[0][half.slices_zyx()] = written[0]
        np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)
    assert cache_tier.upkeep.flush_all() and np.array_equal(cache_tier._base.read(cut(WHOLE)), data)


@pytest.mark.parametrize("held", ["read", "write"])
def test_a_small_write_waits_for_any_holder_of_its_lock(cache_tier: CacheTier, redis_url: str, held: str) -> None:
    """A reader holding the lock may be the flusher, between writing the supercuboid back and
    clearing its dirty mark: a write committed then would never be written back."""
    data = values(WHOLE, 24)
    cache_tier.write(cut(WHOLE), data)
    other_process = RedisRWLocks(redis_client.connect(redis_url), timeout_s=30)
    (name,) = cut(SMALL).plan().names
    done = threading.Event()
    with getattr(other_process, held)([name]):
        writer = threading.Thread(target=lambda: (cache_tier.write(cut(SMALL), values(SMALL, 25)), done.set()))
        writer.start()
        time.sleep(0.5)
        assert not done.is_set()
    writer.join(10)
    assert done.is_set()
    data[0][SMALL.slices_zyx()] = values(SMALL, 25)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)


def test_a_small_write_raced_by_another_write_into_its_cuboids_loses_neither(
        cache_tier: CacheTier, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer changes a cuboid this write merges into between its snapshot and its
    commit: the commit is refused, the write is made again under locks, and both writes stay."""
    data = values(WHOLE, 26)
    cache_tier.write(cut(WHOLE), data)
    other = make_cache_tier(tmp_path, redis_url, lock_free=False)
    beside = Box((SMALL.hi[0], SMALL.lo[1], SMALL.lo[2]), (SMALL.hi[0] + 4, SMALL.hi[1], SMALL.hi[2]))  # same cuboid
    assert cut(beside).plan().names == cut(SMALL).plan().names
    snapshot = cache_tier._lock_free.commits.read_for_update
    refused: list[bool] = []
    commit = cache_tier._lock_free.commits.commit_unlocked

    def raced(*args: Any, **kwargs: Any) -> Any:
        seen = snapshot(*args, **kwargs)
        if not refused:
            other.write(cut(beside), values(beside, 27))
        return seen

    def counted(*args: Any, **kwargs: Any) -> bool:
        applied = commit(*args, **kwargs)
        refused.append(not applied)
        return applied

    monkeypatch.setattr(cache_tier._lock_free.commits, "read_for_update", raced)
    monkeypatch.setattr(cache_tier._lock_free.commits, "commit_unlocked", counted)
    cache_tier.write(cut(SMALL), values(SMALL, 28))
    assert refused == [True]  # the optimistic commit saw the change and stored nothing
    data[0][beside.slices_zyx()] = values(beside, 27)[0]
    data[0][SMALL.slices_zyx()] = values(SMALL, 28)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)


def test_a_write_into_other_cuboids_of_its_supercuboid_leaves_a_small_write_lock_free(
        cache_tier: CacheTier, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another small write into other cuboids of the same supercuboid commits between this one's
    snapshot and its commit: the cuboids this one merged into are as it read them, so its commit
    is applied, still without locks (an annotator's strokes side by side do not queue)."""
    data = values(WHOLE, 31)
    cache_tier.write(cut(WHOLE), data)
    other = make_cache_tier(tmp_path, redis_url)  # another worker's, lock-free as well
    elsewhere = Box((3, CUBOID[1] + 5, 1), (9, CUBOID[1] + 17, 2))  # other cuboids, same supercuboid
    assert cut(elsewhere).plan().names == cut(SMALL).plan().names
    snapshot, applied = cache_tier._lock_free.commits.read_for_update, []
    commit = cache_tier._lock_free.commits.commit_unlocked

    def raced(*args: Any, **kwargs: Any) -> Any:
        seen = snapshot(*args, **kwargs)
        other.write(cut(elsewhere), values(elsewhere, 32))
        return seen

    def counted(*args: Any, **kwargs: Any) -> bool:
        applied.append(commit(*args, **kwargs))
        return applied[-1]

    monkeypatch.setattr(cache_tier._lock_free.commits, "read_for_update", raced)
    monkeypatch.setattr(cache_tier._lock_free.commits, "commit_unlocked", counted)
    cache_tier.write(cut(SMALL), values(SMALL, 33))
    assert applied == [True]
    data[0][elsewhere.slices_zyx()] = values(elsewhere, 32)[0]
    data[0][SMALL.slices_zyx()] = values(SMALL, 33)[0]
    np.testing.assert_array_equal(cache_tier.read(cut(WHOLE)), data)


@pytest.mark.parametrize("why", ["a cuboid changed", "a reader holds the lock", "not resident", "unchecked Redis"])
def test_a_refused_commit_leaves_the_redis_as_it_was(cache_tier: CacheTier, redis_url: str, why: str) -> None:
    """A refused commit stores its cuboids in the same transaction as the check, into a fresh hash,
    with the old one moved aside and back: afterwards every key holds what it held before
    (the supercuboid's other cuboids included), and nothing it used is left behind."""
    cache_tier.write(cut(WHOLE), values(WHOLE, 34))
    cache_tier.upkeep.flush_all()
    (name,) = cut(SMALL).plan().names
    commits = cache_tier._lock_free.commits
    direct = redis.Redis.from_url(redis_url)
    seen = commits.read_for_update({name: [0]}, 1.0)
    assert seen is not None
    expected = {name: {0: seen[name][1][0]}}
    if why == "a cuboid changed":
        expected = {name: {0: b"another digest"}}
    elif why == "a reader holds the lock":
        direct.zadd(RedisRWLocks.keys(name)[0], {"someone": 1})
    elif why == "not resident":
        cache_tier._cache.evict(name)
    else:
        direct.delete(EPOCH)

    before = everything_in(direct)
    new = {name: {0: compress_cuboid(np.full(GRID.cuboid[::-1], 9, np.uint8)),
                  1: compress_cuboid(np.full(GRID.cuboid[::-1], 8, np.uint8))}}
    assert not commits.commit_unlocked(new, expected, 2.0)
    assert everything_in(direct) == before


@pytest.mark.parametrize("cuboids", [2, 12])  # one HSET in the commit's MULTI; a staged hash renamed (12
# incompressible cuboids need more than one command: test_redis_commands.py)
def test_a_store_into_an_unchecked_redis_is_refused_and_changes_nothing(cache_tier: CacheTier, redis_url: str,
                                                                         cuboids: int) -> None:
    """The locked path's store (`put`) sends its cuboids as HSETs in a MULTI as well: in a Redis
    whose holdings were not checked it is refused (RedisUnverified) and every key stays as it was."""
    cache_tier.write(cut(WHOLE), values(WHOLE, 38))
    cache_tier.upkeep.flush_all()
    (name,) = cut(SMALL).plan().names
    direct = redis.Redis.from_url(redis_url)
    direct.delete(EPOCH)
    before = everything_in(direct)
    noise = np.random.default_rng(cuboids)
    new = {n: compress_cuboid(noise.integers(0, 256, GRID.cuboid[::-1], np.uint8)) for n in range(cuboids)}
    with pytest.raises(RedisUnverified):
        cache_tier._cache.put(name, new, 3.0, dirty=True)
    assert everything_in(direct) == before


def everything_in(direct: redis.Redis) -> dict[bytes, Any]:
    """Every key of a Redis and what it holds."""
    out: dict[bytes, Any] = {}
    for key in sorted(direct.keys("*")):
        kind = direct.type(key)
        out[key] = (direct.hgetall(key) if kind == b"hash" else direct.zrange(key, 0, -1, withscores=True)
                    if kind == b"zset" else direct.get(key) if kind == b"string" else kind)
    return out


def test_concurrent_small_writes_into_one_cuboid_all_land(tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    tiers = [make_cache_tier(tmp_path, redis_url) for _ in range(4)]
    tiers[0].write(cut(WHOLE), np.zeros((1, *WHOLE.shape_zyx), np.uint8))
    columns = [Box((x, 0, 0), (x + 1, 8, 2)) for x in range(32)]  # 32 writes into cuboid 0

    def write(i: int) -> None:
        for box in columns[i::4]:
            tiers[i].write(cut(box), np.full((1, *box.shape_zyx), box.lo[0] + 1, np.uint8))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = tiers[0].read(cut(Box((0, 0, 0), (32, 8, 2))))[0]
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(1, 33, dtype=np.uint8), (2, 8, 32)))
