"""A cold read answers from the objects it fetched and stores them in the cache afterwards, on a
thread that holds the read's locks until they are stored (`PageIns`, ndstore/engine/cache/copies.py).
Until then no writer, direct writer or other reader gets at those supercuboids; a page-in that
fails leaves them not resident and unlocked; without room for more such page-ins, a read stores
its own before it answers. The engine's own logic, on the in-memory cuboid cache (and a file
store); a page-in held across a restart of the Redis, on a real redis-server. The gate below
only holds the real page-in back until the test lets it go."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from ndstore.core.errors import StorageError
from ndstore.core.geometry import Box
from ndstore.engine.cache.parts import touching
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.volume import make_cutout
from tests.engine.conftest import make_cache_tier, make_memory_tier, small_channel

CHANNEL = small_channel("uint8", cid=31)
GRID = CHANNEL.grid(0)
SUPER = Box((0, 0, 0), GRID.supercuboid)
SMALL = Box((5, 6, 1), (40, 50, 3))  # inside the first supercuboid, a few cuboids
WAIT_S = 10.0


def cut(box: Box) -> Any:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


[NAME] = cut(SUPER).plan().names


class Gate:
    """Holds the cache's page-ins (or its fills: ``method``) back until `open` (or makes the next
    one fail, as a Redis error would)."""

    def __init__(self, tier: CacheTier, method: str = "page_in"):
        self.entered = threading.Event()
        self._opened = threading.Event()
        self._fail = False
        cache = tier._cache
        real = getattr(cache, method)

        def held(*args: Any, **kwargs: Any) -> None:
            self.entered.set()
            assert self._opened.wait(WAIT_S), "the test never opened the gate"
            if self._fail:
                self._fail = False
                raise StorageError("cache unavailable: connection reset (the test's)")
            real(*args, **kwargs)

        setattr(cache, method, held)

    def open(self, fail: bool = False) -> None:
        self._fail = fail
        self._opened.set()


class Counted(Counter[str]):
    """An observer that adds up its counters (labels ignored)."""

    def count(self, name: str, value: float = 1, **labels: str) -> None:
        self[name] += int(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        pass


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    return thread, result


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[CacheTier, np.ndarray]]:
    """A cache tier over a base tier holding the first supercuboid (random voxels), none cached."""
    yield from stored_in(make_memory_tier(tmp_path))


@pytest.fixture
def stored_on_redis(tmp_path: Path, redis_url: str) -> Iterator[tuple[CacheTier, np.ndarray]]:
    redis.Redis.from_url(redis_url).flushdb()
    yield from stored_in(make_cache_tier(tmp_path, redis_url))


def stored_in(tier: CacheTier) -> Iterator[tuple[CacheTier, np.ndarray]]:
    voxels = np.random.default_rng(31).integers(1, 255, SUPER.shape_zyx, dtype=np.uint8)
    tier.write_base(cut(SUPER), voxels[np.newaxis])
    assert tier._cache.resident([NAME]) == [False]
    yield tier, voxels
    tier.settle()


def test_a_cold_read_answers_before_its_page_in_is_stored(stored: tuple[CacheTier, np.ndarray]) -> None:
    tier, voxels = stored
    gate = Gate(tier)
    reader, answer = in_thread(lambda: tier.read(cut(SUPER)))
    reader.join(WAIT_S)
    assert not reader.is_alive(), "the read waited for its page-in"
    np.testing.assert_array_equal(answer[0][0], voxels)
    assert gate.entered.wait(WAIT_S) and tier._cache.resident([NAME]) == [False]
    gate.open()
    tier.settle()
    assert tier._cache.resident([NAME]) == [True]
    np.testing.assert_array_equal(tier.read(cut(SMALL))[0], voxels[SMALL.slices_zyx()])


WRITERS = ["small write", "large write", "direct write", "read"]


@pytest.mark.parametrize("other", WRITERS)
def test_no_one_gets_at_a_supercuboid_before_its_page_in_is_stored(stored: tuple[CacheTier, np.ndarray],
                                                                   other: str) -> None:
    """The page-in holds the read's write lock: a write, a direct write (which would otherwise
    change the base tier under a page-in of its old voxels) and another read all wait for it,
    and then see every voxel as last written."""
    tier, voxels = stored
    gate = Gate(tier)
    tier.read(cut(SUPER))
    assert gate.entered.wait(WAIT_S)
    waits_then_sees_the_last_write(tier, gate, other, voxels)


def waits_then_sees_the_last_write(tier: CacheTier, gate: Gate, other: str, voxels: np.ndarray) -> None:
    """``other`` (one of WRITERS) on the supercuboid, while ``gate`` holds a store into it back:
    it waits, and then sees (and leaves) every voxel as last written (``voxels``: before it)."""
    box = SMALL if other == "small write" else SUPER
    new = np.full(box.shape_zyx, 7, np.uint8)
    do: dict[str, Callable[[], Any]] = {
        "small write": lambda: tier.write(cut(SMALL), new[np.newaxis]),
        "large write": lambda: tier.write(cut(SUPER), new[np.newaxis]),
        "direct write": lambda: tier.write_base(cut(SUPER), new[np.newaxis]),
        "read": lambda: tier.read(cut(SUPER)),
    }
    worker, result = in_thread(do[other])
    worker.join(0.5)
    assert worker.is_alive(), f"the {other} did not wait for the held-back store"
    gate.open()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    if other == "read":
        np.testing.assert_array_equal(result[0][0], voxels)
        return
    expected = voxels.copy()
    expected[box.slices_zyx()] = 7
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], expected)
    tier.upkeep.flush_all()
    np.testing.assert_array_equal(tier.read_raw(cut(SUPER))[0], expected)


def test_a_failed_page_in_leaves_it_not_resident_and_unlocked(stored: tuple[CacheTier, np.ndarray]) -> None:
    tier, voxels = stored
    gate = Gate(tier)
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], voxels)
    gate.open(fail=True)
    tier.settle()
    assert tier._cache.resident([NAME]) == [False]
    new = np.full(SMALL.shape_zyx, 9, np.uint8)
    tier.write(cut(SMALL), new[np.newaxis])  # would wait out the lock's timeout if it were still held
    expected = voxels.copy()
    expected[SMALL.slices_zyx()] = 9
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], expected)


def test_without_room_a_read_stores_its_page_ins_before_it_answers(tmp_path: Path) -> None:
    """The objects page-ins hold after their reads answered are bounded per process (a read
    window): beyond that a read pages in first, as it always did."""
    tier = make_memory_tier(tmp_path)
    tier._page_ins._room = GRID.supercuboid_bytes(1) - 1  # no room for one supercuboid
    voxels = np.random.default_rng(32).integers(1, 255, SUPER.shape_zyx, dtype=np.uint8)
    tier.write_base(cut(SUPER), voxels[np.newaxis])
    gate = Gate(tier)
    reader, answer = in_thread(lambda: tier.read(cut(SUPER)))
    assert gate.entered.wait(WAIT_S)
    reader.join(0.5)
    assert reader.is_alive(), "the read answered before its page-in was stored"
    gate.open()
    reader.join(WAIT_S)
    np.testing.assert_array_equal(answer[0][0], voxels)
    assert tier._cache.resident([NAME]) == [True]


def test_a_page_in_held_across_a_restart_that_lost_the_redis_does_not_land_over_a_later_write(
        stored_on_redis: tuple[CacheTier, np.ndarray], redis_url: str) -> None:
    """The Redis restarts without its data while a page-in is on its way in: its checked mark and
    the lock the page-in holds are gone, so a writer in the new run pages the supercuboid in
    again and writes. The old page-in (fetched in the old run) must not land over that write; it
    fails, and the supercuboid holds the write, in the cache and after its write-back. (Without
    the run check the old copy is stored over the writer's cuboids: the write is lost.)"""
    tier, voxels = stored_on_redis
    gate = Gate(tier)
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], voxels)
    assert gate.entered.wait(WAIT_S)
    redis.Redis.from_url(redis_url).flushdb()  # the restart: marks, locks and cuboids gone
    del tier._cache.page_in  # the writer's own page-in is not held back
    new = np.full(SMALL.shape_zyx, 7, np.uint8)
    tier.write(cut(SMALL), new[np.newaxis])  # checks the new Redis (a new run), pages in, writes
    gate.open()
    tier.settle()
    expected = voxels.copy()
    expected[SMALL.slices_zyx()] = 7
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], expected)
    tier.upkeep.flush_all()
    np.testing.assert_array_equal(tier.read_raw(cut(SUPER))[0], expected)


@pytest.mark.parametrize("other", WRITERS)
def test_no_one_gets_at_a_supercuboid_before_the_rest_of_a_cold_write_is_stored(
        stored: tuple[CacheTier, np.ndarray], other: str) -> None:
    """A small write into a supercuboid not resident stores its cuboids, answers, and hands its
    lock to the thread that stores the rest of the object it fetched: until that is stored, a
    write, a direct write and a read wait, and then see every voxel as last written."""
    tier, voxels = stored
    gate = Gate(tier, "fill")
    first = Box((100, 100, 10), (140, 130, 12))
    tier.write(cut(first), np.full((1, *first.shape_zyx), 3, np.uint8))
    assert gate.entered.wait(WAIT_S)
    expected = voxels.copy()
    expected[first.slices_zyx()] = 3
    waits_then_sees_the_last_write(tier, gate, other, expected)


@pytest.mark.parametrize("case", ["the rest fails to store", "no room for the rest"])
def test_a_cold_write_whose_rest_is_not_stored_leaves_it_absent_and_unlocked(
        stored: tuple[CacheTier, np.ndarray], case: str) -> None:
    """The rest of a cold write's object is only a copy of the base tier: when storing it fails,
    or there is no room to hold it after the write, it stays absent (restored by whatever needs
    it) and the lock is released; the write's own cuboids were stored."""
    tier, voxels = stored
    if case == "no room for the rest":
        tier._page_ins._room = 0
    else:
        gate = Gate(tier, "fill")
        gate.open(fail=True)
    first = Box((100, 100, 10), (140, 130, 12))
    tier.write(cut(first), np.full((1, *first.shape_zyx), 3, np.uint8))
    tier.settle()
    per_super = GRID.cuboid_count
    [part] = cut(first).plan().parts
    touched = {number for number, _, _ in touching(part.part, GRID)}
    assert set(tier._cache.absent(NAME, range(per_super))) == set(range(per_super)) - touched
    if case != "no room for the rest":
        del tier._cache.fill
    tier.write(cut(SMALL), np.full((1, *SMALL.shape_zyx), 7, np.uint8))  # would wait out a held lock
    expected = voxels.copy()
    expected[first.slices_zyx()] = 3
    expected[SMALL.slices_zyx()] = 7
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], expected)
    tier.upkeep.flush_all()
    np.testing.assert_array_equal(tier.read_raw(cut(SUPER))[0], expected)


@pytest.mark.parametrize("room", [True, False])
def test_a_read_of_a_supercuboid_lacking_cuboids_answers_from_its_object(stored: tuple[CacheTier, np.ndarray],
                                                                         room: bool) -> None:
    """A write that covers whole the cuboids it touches leaves the rest of a supercuboid absent.
    A read that wants them fetches the object under the write lock and answers from it; the
    absent cuboids are stored after the answer (a write waits for them), or, without room,
    before it, and counted as restores either way. Every voxel reads back as last written."""
    tier, voxels = stored
    tier._copies._observer = counted = Counted()  # what counts restores
    if not room:
        tier._page_ins._room = 0
    cuboid = GRID.cuboid
    first = Box((0, 0, 0), cuboid)  # one cuboid, whole: nothing fetched
    tier.write(cut(first), np.full((1, *first.shape_zyx), 3, np.uint8))
    per_super = GRID.cuboid_count
    assert len(tier._cache.absent(NAME, range(per_super))) == per_super - 1
    expected = voxels.copy()
    expected[first.slices_zyx()] = 3
    gate = Gate(tier, "fill")
    if not room:
        gate.open()
    reader, answer = in_thread(lambda: tier.read(cut(SUPER)))
    reader.join(WAIT_S)
    assert not reader.is_alive(), "the read waited for the absent cuboids to be stored"
    np.testing.assert_array_equal(answer[0][0], expected)
    if room:
        assert gate.entered.wait(WAIT_S)
        writer, _ = in_thread(lambda: tier.write(cut(SMALL), np.full((1, *SMALL.shape_zyx), 7, np.uint8)))
        writer.join(0.5)
        assert writer.is_alive(), "the write did not wait for the absent cuboids to be stored"
        gate.open()
        writer.join(WAIT_S)
    else:
        tier.write(cut(SMALL), np.full((1, *SMALL.shape_zyx), 7, np.uint8))
    tier.settle()
    assert tier._cache.absent(NAME, range(per_super)) == []
    assert counted["cache_restores_total"] == per_super - 1
    expected[SMALL.slices_zyx()] = 7
    np.testing.assert_array_equal(tier.read(cut(SUPER))[0], expected)
    tier.upkeep.flush_all()
    np.testing.assert_array_equal(tier.read_raw(cut(SUPER))[0], expected)
