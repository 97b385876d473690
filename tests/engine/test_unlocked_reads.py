"""Small reads take one lock-free atomic snapshot (CacheTier.read, RedisCuboidCache.read_unlocked)
and fall back to the locked read whenever it would not be safe: a writer holds the lock, the
supercuboid is not resident, is marked lost, is damaged, or the Redis is not checked."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import redis

from ndstore.core.chunks import compress_cuboid, cuboid_boxes
from ndstore.core.errors import DataLost
from ndstore.core.geometry import Box
from ndstore.engine.cache_tier import SNAPSHOT_CUBOIDS, CacheTier
from ndstore.engine.volume import make_cutout
from ndstore.storage import redis_client
from ndstore.storage.redis_cache import EPOCH, RedisCuboidCache
from ndstore.storage.rwlock import RedisRWLocks
from tests.engine.conftest import small_channel

CHANNEL = small_channel("uint8", cid=41)
GRID = CHANNEL.grid(0)
SC, CUBOID = GRID.supercuboid, GRID.cuboid
WHOLE = Box((0, 0, 0), SC)
SMALL = Box((3, 5, 1), (CUBOID[0] + 9, 17, 2))  # two cuboids of one supercuboid


def cut(box: Box) -> Any:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


def values(box: Box, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, (1, *box.shape_zyx), np.uint8)


class RoundTrips:
    """Requests this thread sends to Redis (a pipeline is one), counted at redis-py's socket."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count, thread = 0, threading.get_ident()
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            if threading.get_ident() == thread:
                self.count += 1
            send(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def during(self, fn: Any) -> tuple[int, Any]:
        before = self.count
        result = fn()
        return self.count - before, result


def test_a_small_resident_read_is_one_round_trip_and_a_large_one_takes_locks(
        cache_tier: CacheTier, monkeypatch: pytest.MonkeyPatch) -> None:
    data = values(WHOLE, 1)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.read(cut(SMALL))  # Redis has loaded the script (a first call sends it)
    trips = RoundTrips(monkeypatch)

    sent, got = trips.during(lambda: cache_tier.read(cut(SMALL)))
    assert sent == 1
    np.testing.assert_array_equal(got, data[0][SMALL.slices_zyx()][None])

    assert int(np.prod(GRID.cuboids_per_super)) > SNAPSHOT_CUBOIDS
    sent, got = trips.during(lambda: cache_tier.read(cut(WHOLE)))
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


def test_a_small_read_sees_a_write_that_finished_before_it(cache_tier: CacheTier) -> None:
    cache_tier.write(cut(WHOLE), values(WHOLE, 4))
    for seed in range(5, 10):
        cache_tier.write(cut(SMALL), values(SMALL, seed))
        np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), values(SMALL, seed))


def test_a_damaged_cuboid_met_by_a_small_read_is_paged_in_again(cache_tier: CacheTier, redis_url: str) -> None:
    data = values(WHOLE, 11)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.flush_all()  # clean: the base tier holds it, the cached copy may be dropped
    (name,) = cut(SMALL).plan().names
    client = redis.Redis.from_url(redis_url)
    blob = bytearray(client.hget(f"ndc:{{{name}}}", "0") or b"")
    blob[len(blob) // 2] ^= 0xFF
    client.hset(f"ndc:{{{name}}}", "0", bytes(blob))
    np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), data[0][SMALL.slices_zyx()][None])


def test_a_small_read_of_a_lost_supercuboid_is_refused(cache_tier: CacheTier, redis_url: str) -> None:
    cache_tier.write(cut(WHOLE), values(WHOLE, 12))
    (name,) = cut(SMALL).plan().names
    RedisCuboidCache(redis_client.connect(redis_url)).mark_lost({name: "test: gone"})
    with pytest.raises(DataLost) as refused:
        cache_tier.read(cut(SMALL))
    assert refused.value.names == [name]


def test_a_small_read_in_an_unchecked_redis_checks_it_first(cache_tier: CacheTier, redis_url: str) -> None:
    data = values(WHOLE, 13)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.flush_all()
    client = redis.Redis.from_url(redis_url)
    client.delete(EPOCH)  # as a Redis that restarted: its holdings unchecked
    cache_before = cache_tier.verify
    checked: list[bool] = []
    cache_tier.verify = lambda: checked.append(True) or cache_before()  # type: ignore[method-assign]
    got = cache_tier.read(cut(SMALL))
    assert checked and client.exists(EPOCH)
    np.testing.assert_array_equal(got, data[0][SMALL.slices_zyx()][None])


def test_a_small_read_of_a_missing_supercuboid_pages_it_in(cache_tier: CacheTier) -> None:
    data = values(WHOLE, 14)
    cache_tier.write(cut(WHOLE), data)
    cache_tier.flush_all()
    (name,) = cut(SMALL).plan().names
    with cache_tier.exclusive([name]):  # written back and dropped
        pass
    np.testing.assert_array_equal(cache_tier.read(cut(SMALL)), data[0][SMALL.slices_zyx()][None])
