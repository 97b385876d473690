"""The cache tier's own logic: a stateful model of cache + base tier checked against a numpy
array (on the in-memory cuboid cache and on a real redis-server), coherence with direct I/O,
eviction, write-back and write-through (on each cuboid cache, or where the Redis run adds nothing
the cuboid cache's contract suite does not check, on the in-memory one: tests/contracts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ndstore.core.geometry import Box
from ndstore.engine.cache.daemons import CacheManager, Flusher
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import make_cutout
from tests.engine.conftest import make_cache_tier, make_memory_tier, small_channel

LIMIT = 1 << 32
CHANNEL = small_channel("uint16")
EXTENT = CHANNEL.extent(0)


def cut(box: Box) -> Any:
    return make_cutout(CHANNEL, 0, box, range(1), LIMIT)


@st.composite
def boxes(draw: st.DrawFn) -> Box:
    lo = [draw(st.integers(0, s - 1)) for s in EXTENT.hi]
    hi = [draw(st.integers(a + 1, min(s, a + 700))) for a, s in zip(lo, EXTENT.hi)]
    return Box(tuple(lo), tuple(hi))  # type: ignore[arg-type]


class CacheModel(RuleBasedStateMachine):
    """Any interleaving of cached and direct reads and writes, write-backs and evictions reads
    exactly what a plain numpy array holds."""

    redis_url = ""  # "": on the in-memory cuboid cache
    root = Path()

    @initialize()
    def setup(self) -> None:
        run = self.root / f"run-{np.random.default_rng().integers(1 << 40)}"
        if self.redis_url:
            redis.Redis.from_url(self.redis_url).flushdb()
            self.tier: CacheTier = make_cache_tier(run, self.redis_url)
        else:
            self.tier = make_memory_tier(run)
        self.direct = CoherentDirect(self.tier)
        self.reference = np.zeros(EXTENT.shape_zyx, np.uint16)
        self.seed = 0

    def _values(self, box: Box, zero: bool) -> np.ndarray:
        self.seed += 1
        if zero:
            return np.zeros(box.shape_zyx, np.uint16)
        return np.random.default_rng(self.seed).integers(1, 60000, box.shape_zyx, dtype=np.uint16)

    @rule(box=boxes(), via_cache=st.booleans(), zero=st.booleans())
    def write(self, box: Box, via_cache: bool, zero: bool) -> None:
        values = self._values(box, zero)
        (self.tier if via_cache else self.direct).write(cut(box), values[np.newaxis])
        self.reference[box.slices_zyx()] = values

    @rule(box=boxes(), via_cache=st.booleans())
    def read(self, box: Box, via_cache: bool) -> None:
        got = (self.tier if via_cache else self.direct).read(cut(box))[0]
        np.testing.assert_array_equal(got, self.reference[box.slices_zyx()])

    @rule()
    def flush(self) -> None:
        self.tier.upkeep.flush_all()
        whole = self.tier._base.read(cut(EXTENT))[0]  # the base tier alone now holds everything
        np.testing.assert_array_equal(whole, self.reference)

    @rule()
    def evict_everything(self) -> None:
        CacheManager(self.tier.upkeep, high_bytes=0, low_bytes=0).run_once()
        assert self.tier._cache.count() == (0, 0)

    @invariant()
    def dirty_is_resident(self) -> None:
        if hasattr(self, "tier"):
            resident, dirty = self.tier._cache.count()
            assert dirty <= resident


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_cache_model(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> None:
    CacheModel.redis_url = request.getfixturevalue("redis_url") if kind == "redis" else ""
    CacheModel.root = tmp_path
    runner = CacheModel.TestCase()  # on Redis, fewer runs: its adapter's contract is tests/contracts
    runner.settings = settings(max_examples=8 if kind == "memory" else 4, stateful_step_count=12, deadline=None)
    runner.runTest()


def count_base_gets(tier: CacheTier) -> list[str]:
    """The object keys the tier GETs from its base tier from now on, as a list that grows."""
    fetched: list[str] = []
    real = tier._base.objects.get_many

    def counting(keys: Any, window: int | None = None) -> Any:
        fetched.extend(keys)
        return real(keys, window)

    tier._base.objects.get_many = counting  # type: ignore[method-assign]
    return fetched


def test_concurrent_misses_fetch_once(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    import threading

    box = Box((0, 0, 0), EXTENT.hi)
    cache_tier._base.write(cut(box), np.ones((1, *box.shape_zyx), np.uint16))
    fetched = count_base_gets(cache_tier)
    threads = [threading.Thread(target=cache_tier.read, args=(cut(box),)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(fetched) == sorted(set(fetched)) and len(fetched) == 8


def test_a_write_that_replaces_a_supercuboid_whole_reads_nothing_of_the_old_one(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    """No page-in for a supercuboid the write covers whole; one it covers in part has its partly
    covered cuboids read from the base tier (one GET), and both read back exactly, from the cache
    and, once written back, from the base tier."""
    sc = CHANNEL.grid(0).supercuboid
    cache_tier._base.write(cut(Box((0, 0, 0), EXTENT.hi)), np.full((1, *EXTENT.shape_zyx), 7, np.uint16))
    fetched = count_base_gets(cache_tier)
    whole = Box((0, 0, 0), sc)
    data = np.arange(np.prod(whole.shape_zyx), dtype=np.uint16).reshape(1, *whole.shape_zyx)
    cache_tier.write(cut(whole), data)
    assert fetched == []
    part = Box((sc[0], 0, 0), (sc[0] + 5, 5, 5))
    cache_tier.write(cut(part), np.ones((1, 5, 5, 5), np.uint16))
    assert len(fetched) == 1
    np.testing.assert_array_equal(cache_tier.read(cut(whole)), data)
    expected = np.full((1, *EXTENT.shape_zyx), 7, np.uint16)
    expected[0, :sc[2], :sc[1], :sc[0]] = data[0]
    expected[0, :5, :5, sc[0]:sc[0] + 5] = 1
    np.testing.assert_array_equal(cache_tier.read(cut(Box((0, 0, 0), EXTENT.hi))), expected)
    cache_tier.upkeep.flush_all()
    np.testing.assert_array_equal(cache_tier.read_raw(cut(Box((0, 0, 0), EXTENT.hi))), expected)


def test_a_write_to_a_supercuboid_not_resident_stores_the_cuboids_it_touches_first(memory_tier: CacheTier) -> None:
    cache_tier = memory_tier
    """A write into a supercuboid not in the cache is not held up by a page-in: cuboids it covers
    whole need nothing from the base tier, and the rest of the supercuboid stays absent (clean:
    the base tier holds it) until something needs it and restores it; a write that merges into
    cuboids it covers in part fetches the object once, stores its cuboids, answers, and the rest
    of the object is stored afterwards, under the write's lock. Every voxel reads back, from the
    cache and from the base tier."""
    import threading

    grid = CHANNEL.grid(0)
    cub, sc = grid.cuboid, grid.supercuboid
    per_super = grid.cuboid_count
    old = np.random.default_rng(3).integers(1, 60000, (1, *EXTENT.shape_zyx), dtype=np.uint16)
    cache_tier._base.write(cut(Box((0, 0, 0), EXTENT.hi)), old)
    fetched = count_base_gets(cache_tier)
    covered = Box((0, 0, 0), (2 * cub[0], cub[1], cub[2]))  # two cuboids of the first supercuboid, whole
    cache_tier.write(cut(covered), np.full((1, *covered.shape_zyx), 5, np.uint16))
    assert fetched == []
    [name] = cut(covered).plan().names
    assert len(cache_tier._cache.absent(name, range(per_super))) == per_super - 2

    held, go = threading.Event(), threading.Event()
    real_fill = cache_tier._cache.fill

    def held_fill(*args: Any) -> None:
        held.set()
        assert go.wait(10)
        real_fill(*args)

    cache_tier._cache.fill = held_fill  # type: ignore[method-assign]
    part = Box((sc[0] + 3, 4, 1), (sc[0] + 9, 9, 4))  # inside one cuboid of the second, in part
    cache_tier.write(cut(part), np.full((1, *part.shape_zyx), 9, np.uint16))  # returns with the rest held
    assert len(fetched) == 1 and held.wait(10)
    [other] = cut(part).plan().names
    assert len(cache_tier._cache.absent(other, range(per_super))) == per_super - 1
    go.set()
    cache_tier.settle()
    del cache_tier._cache.fill
    assert cache_tier._cache.absent(other, range(per_super)) == []
    expected = old.copy()
    expected[(0, *covered.slices_zyx())] = 5
    expected[(0, *part.slices_zyx())] = 9
    whole = Box((0, 0, 0), EXTENT.hi)
    np.testing.assert_array_equal(cache_tier.read(cut(whole)), expected)
    assert cache_tier._cache.absent(name, range(per_super)) == []
    cache_tier.upkeep.flush_all()
    np.testing.assert_array_equal(cache_tier.read_raw(cut(whole)), expected)


def test_all_zero_supercuboids_are_cached_as_known_zero(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    got = cache_tier.read(cut(Box((0, 0, 0), (10, 10, 2))))
    assert not got.any()
    cache_tier.settle()  # its page-in is stored after the answer
    blobs = cache_tier._cache.get_all(cache_tier._cache.coldest(1)[0], 64)
    assert blobs == [b""] * 64


def test_flusher_writes_back_after_the_age_threshold(tmp_path: Path) -> None:
    now = [1000.0]
    cache_tier = make_memory_tier(tmp_path, clock=lambda: now[0])
    box = Box((5, 5, 1), (300, 40, 3))
    cache_tier.write(cut(box), np.full((1, *box.shape_zyx), 7, np.uint16))
    flusher = Flusher(cache_tier.upkeep, age_s=5)
    assert flusher.run_once() == 0  # too young
    assert cache_tier._base.index.mortons(CHANNEL.volume_key(0, 0)) == []
    now[0] += 6
    assert flusher.run_once() == 1
    assert cache_tier._base.index.mortons(CHANNEL.volume_key(0, 0)) == [0]
    assert cache_tier._cache.count() == (1, 0)


def test_write_through_channel_reaches_the_base_tier_before_returning(any_cache_tier: CacheTier) -> None:
    cache_tier = any_cache_tier
    chan = small_channel("uint8", write_through=True, cid=9)
    box = Box((0, 0, 0), (20, 20, 2))
    cache_tier.write(make_cutout(chan, 0, box, range(1), LIMIT), np.full((1, 2, 20, 20), 3, np.uint8))
    assert cache_tier._cache.count() == (1, 0)
    assert cache_tier._base.read(make_cutout(chan, 0, box, range(1), LIMIT)).min() == 3


def test_eviction_under_a_memory_cap_loses_no_dirty_data(memory_tier: CacheTier) -> None:
    cache_tier = memory_tier
    chan = small_channel("uint8", cid=11)
    rng = np.random.default_rng(0)
    extent = chan.extent(0)
    data = rng.integers(0, 255, extent.shape_zyx, dtype=np.uint8)
    cache_tier.write(make_cutout(chan, 0, extent, range(1), LIMIT), data[np.newaxis])
    used = cache_tier._cache.used_memory()
    manager = CacheManager(cache_tier.upkeep, high_bytes=used // 2, low_bytes=used // 3)
    assert manager.run_once() > 0
    resident, dirty = cache_tier._cache.count()
    assert resident < 8 and cache_tier._cache.used_memory() <= used // 2
    np.testing.assert_array_equal(cache_tier.read(make_cutout(chan, 0, extent, range(1), LIMIT))[0], data)
