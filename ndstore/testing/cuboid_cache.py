"""The contract of the cuboid cache's ports (`CuboidCache` and its parts, ndstore/storage/interfaces.py),
written once and run on every implementation: subclass `CuboidCacheContract`, give it the `cache`
fixture (an empty cache), and `locks` and `damage` where the implementation has them
(tests/contracts/test_cuboid_cache.py runs it on RedisCuboidCache on a redis-server and on a
Redis Cluster, and on MemoryCuboidCache).

`atomic_runs`: the implementation checks the run of a copy from the base tier, and that its
holdings were checked, in the same atomic step as a clean store (not on a Cluster, whose marks
live in another slot than a supercuboid's hash: there a page-in or fill is a plain store).
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from ndstore.core.errors import DamagedInCache, RedisUnverified
from ndstore.storage.interfaces import CuboidCache, LockFreeCommits, RWLocks

RUN = "run-1"
A, B, C = "1&1&1&0&0&8", "1&1&1&0&0&9", "1&1&2&0&0&8"  # supercuboid names (C: another channel)
META = -1


def checked(cache: CuboidCache) -> CuboidCache:
    """The cache with its holdings checked (run RUN): stores are taken."""
    cache.start_epoch(RUN, 0)
    return cache


class CuboidCacheContract:
    """Subclass it and give ``cache``: an empty cache, never checked (no epoch)."""

    atomic_runs: ClassVar[bool] = True

    @pytest.fixture
    def cache(self) -> CuboidCache:
        raise NotImplementedError("a subclass gives the cache under test")

    @pytest.fixture
    def locks(self) -> RWLocks | None:
        """The locks whose holders the cache's lock-free commits see (None: it offers none)."""
        return None

    def damage(self, cache: CuboidCache, name: str, number: int) -> None:
        """Flip a byte of a stored blob behind the cache's back."""
        pytest.skip("this implementation cannot be damaged from a test")

    # -- CuboidStore -------------------------------------------------------------------------------
    def test_put_then_get(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {META: b"meta", 0: b"zero", 5: b"", 7: memoryview(b"seven")}, 1.0, dirty=False)
        assert cache.resident([A, B]) == [True, False]
        assert cache.get_many({A: [0, 5, 7, 3, META], B: [0]}) == {A: [b"zero", b"", b"seven", None, b"meta"],
                                                                  B: [None]}
        assert cache.get_all(A, 8) == [b"zero", None, None, None, None, b"", None, b"seven"]
        assert cache.get_if_resident({A: [7], B: [7]}) == {A: [b"seven"], B: None}
        assert cache.get_if_resident({A: []}) == {A: []}
        assert cache.is_dirty([A]) == [False] and cache.count() == (1, 0)

    def test_a_put_replaces_the_cuboids_it_names_and_keeps_the_others(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {0: b"a", 1: b"b"}, 1.0, dirty=False)
        cache.put(A, {1: b"B", 2: b"C"}, 2.0, dirty=True)
        assert cache.get_many({A: [0, 1, 2]})[A] == [b"a", b"B", b"C"]

    def test_a_store_into_a_cache_never_checked_is_refused_and_changes_nothing(self, cache: CuboidCache) -> None:
        with pytest.raises(RedisUnverified):
            cache.put(A, {0: b"x"}, 1.0, dirty=True)
        if self.atomic_runs:
            with pytest.raises(RedisUnverified):
                cache.put(B, {0: b"x"}, 1.0, dirty=False)
        assert cache.resident([A]) == [False] and cache.is_dirty([A]) == [False]
        assert cache.held().unflushed == {}

    def test_a_damaged_blob_is_refused_never_returned(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {0: b"some cuboid bytes", 1: b"more bytes"}, 1.0, dirty=True)
        self.damage(cache, A, 0)
        with pytest.raises(DamagedInCache) as damaged:
            cache.get_many({A: [0]})
        assert damaged.value.name == A
        with pytest.raises(DamagedInCache):
            cache.get_if_resident({A: [1, 0]})
        assert cache.get_many({A: [1]}) == {A: [b"more bytes"]}

    # -- DirtySet and the holdings' account --------------------------------------------------------
    def test_dirty_writes_are_numbered_and_dated_by_their_first(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {0: b"a"}, 10.0, dirty=True)
        first = cache.held()
        assert first.epoch == RUN and first.unflushed == {A: first.seq}
        cache.put(A, {0: b"b"}, 20.0, dirty=True)
        cache.put(B, {0: b"c"}, 15.0, dirty=True)
        held = cache.held()
        assert held.seq == first.seq + 2 and held.unflushed == {A: first.seq + 1, B: first.seq + 2}
        assert cache.is_dirty([A, B, C]) == [True, True, False]
        assert cache.oldest_dirty() == 10.0  # A's first dirty write, not its last
        assert cache.dirty_before(12.0, 10) == [A]
        assert cache.dirty_before(float("inf"), 10) == [A, B] and cache.dirty_before(float("inf"), 1) == [A]
        cache.clear_dirty(A)
        assert cache.is_dirty([A]) == [False] and cache.held().unflushed == {B: first.seq + 2}
        assert cache.resident([A]) == [True] and cache.oldest_dirty() == 15.0
        cache.clear_dirty(B)
        assert cache.oldest_dirty() is None and cache.dirty_before(float("inf"), 10) == []

    def test_the_holdings_mark_and_counter(self, cache: CuboidCache) -> None:
        assert cache.held().epoch is None
        cache.start_epoch("e1", 5)
        assert cache.held().epoch == "e1" and cache.held().seq == 5
        cache.put(A, {0: b"a"}, 1.0, dirty=True)
        assert cache.held().unflushed == {A: 6}
        cache.start_epoch("e2", 2)  # a counter never goes back
        assert cache.held().epoch == "e2" and cache.held().seq == 6
        cache.clear_epoch()
        assert cache.held().epoch is None and cache.loss_marks([])[0] is None
        with pytest.raises(RedisUnverified):
            cache.put(A, {0: b"b"}, 2.0, dirty=True)

    # -- Occupancy ---------------------------------------------------------------------------------
    def test_least_recently_used_first(self, cache: CuboidCache) -> None:
        for at, name in enumerate([A, B, C], start=1):
            checked(cache).put(name, {0: b"x"}, float(at), dirty=False)
        cache.touch([A, "never-stored"], 4.0)
        assert cache.coldest(2) == [B, C] and cache.coldest(10) == [B, C, A]
        assert cache.resident(["never-stored"]) == [False]

    def test_an_eviction_drops_a_supercuboid_whole(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {META: b"m", 0: b"a", 1: b"b"}, 1.0, dirty=True)
        cache.put(B, {0: b"c"}, 1.0, dirty=True)
        cache.evict(A)
        cache.evict("never-stored")
        assert cache.resident([A, B]) == [False, True] and cache.is_dirty([A]) == [False]
        assert cache.get_many({A: [META, 0, 1]}) == {A: [None, None, None]}
        assert A not in cache.held().unflushed and cache.count() == (1, 1)

    def test_what_it_holds(self, cache: CuboidCache) -> None:
        assert cache.count() == (0, 0)
        checked(cache).put(A, {0: b"x" * 1000}, 1.0, dirty=True)
        cache.put(B, {0: b"y"}, 1.0, dirty=False)
        cache.put(C, {0: b"z"}, 1.0, dirty=True)
        assert cache.count() == (3, 2) and cache.used_memory() > 1000
        assert cache.names_with_prefix("1&1&1&") == [A, B]
        assert cache.names_with_prefix("") == [A, B, C] and cache.names_with_prefix("2&") == []

    # -- Residency: copies from the base tier ------------------------------------------------------
    def test_a_page_in_is_resident_and_clean(self, cache: CuboidCache) -> None:
        checked(cache).page_in(A, {META: b"m", 0: b"a", 1: memoryview(b"b")}, 3.0, RUN)
        assert cache.resident([A]) == [True] and cache.is_dirty([A]) == [False]
        assert cache.get_many({A: [META, 0, 1]}) == {A: [b"m", b"a", b"b"]}
        assert cache.held().unflushed == {} and cache.coldest(1) == [A]

    def test_a_copy_lands_only_in_the_run_it_was_fetched_in(self, cache: CuboidCache) -> None:
        if not self.atomic_runs:
            pytest.skip("copies are plain stores here (docs/design/cache-tier.md)")
        checked(cache)
        with pytest.raises(RedisUnverified):
            cache.page_in(A, {0: b"old"}, 1.0, "an earlier run")
        assert cache.resident([A]) == [False]
        cache.put(B, {0: b"written"}, 1.0, dirty=True)
        with pytest.raises(RedisUnverified):
            cache.fill(B, {1: b"old"}, "an earlier run")
        cache.clear_epoch()
        with pytest.raises(RedisUnverified):
            cache.page_in(C, {0: b"old"}, 1.0, RUN)
        assert cache.absent(B, [0, 1]) == [1] and cache.resident([C]) == [False]

    def test_a_fill_stores_only_what_is_absent(self, cache: CuboidCache) -> None:
        checked(cache).put(A, {0: b"written"}, 1.0, dirty=True)
        assert cache.absent(A, [META, 0, 1, 2]) == [META, 1, 2]
        cache.fill(A, {1: b"clean"}, RUN)
        if self.atomic_runs:
            cache.fill(A, {0: b"older", 2: b"clean too"}, RUN)
            assert cache.get_many({A: [0, 1, 2]})[A] == [b"written", b"clean", b"clean too"]
        assert cache.absent(A, [0, 1]) == [] and cache.is_dirty([A]) == [True]

    # -- LossMarks ---------------------------------------------------------------------------------
    def test_loss_marks(self, cache: CuboidCache) -> None:
        assert cache.loss_marks([A]) == (None, {}, "")  # never checked; no record of NDBlaze writes
        checked(cache).mark_lost({A: "the cache came back empty", C: "damaged"})
        assert cache.lost() == {A: "the cache came back empty", C: "damaged"}
        run, lost, _ = cache.loss_marks([A, B])
        assert run == RUN and lost == {A: "the cache came back empty"}
        cache.forget_lost([A, "never-lost"])
        assert cache.lost() == {C: "damaged"} and cache.loss_marks([A])[1] == {}
        cache.forget_lost([])
        assert cache.loss_marks([]) == (RUN, {}, None)

    # -- BufferedRecord ----------------------------------------------------------------------------
    def test_the_record_of_ndblaze_writes(self, cache: CuboidCache) -> None:
        """A write is recorded only in the run the record describes, the latest seq wins; a merge
        drops a name only up to the seq it merged; a sync drops what the buffer no longer holds up
        to its counter, keeps later writes, and starts afresh for another run."""
        assert cache.buffered() == (None, {}) and not cache.record_buffered("run-a", {"a": 1})
        assert cache.loss_marks(["a"])[2] == ""  # no record: to be rebuilt
        cache.sync_buffered("run-a", 0, {})
        assert cache.record_buffered("run-a", {"a": 3, "b": 3}) and cache.record_buffered("run-a", {"a": 2, "c": 4})
        assert not cache.record_buffered("run-b", {"d": 5})
        assert cache.buffered() == ("run-a", {"a": 3, "b": 3, "c": 4})
        assert cache.loss_marks(["a", "x"])[2] == "run-a" and cache.loss_marks(["x"])[2] is None
        cache.forget_buffered({"a": 2, "b": 3})  # a has a write after the merged seq 2: kept
        assert cache.buffered()[1] == {"a": 3, "c": 4}
        cache.record_buffered("run-a", {"e": 9})  # recorded after the buffer's account below was read
        cache.sync_buffered("run-a", 8, {"c": 6})  # a merged (not held, 3 <= 8); c held
        assert cache.buffered()[1] == {"c": 6, "e": 9}
        cache.sync_buffered("run-b", 10, {"f": 10})
        assert cache.buffered() == ("run-b", {"f": 10})
        cache.drop_buffered()
        assert cache.buffered() == (None, {})

    # -- many threads ------------------------------------------------------------------------------
    def test_stores_from_many_threads(self, cache: CuboidCache) -> None:
        checked(cache)
        names = [f"1&1&1&0&0&{i}" for i in range(4)]

        def work(name: str) -> None:
            for n in range(20):
                cache.put(name, {n: name.encode() + bytes([n])}, float(n), dirty=True)

        threads = [threading.Thread(target=work, args=(name,)) for name in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert cache.count() == (4, 4) and cache.held().seq == 80
        for name in names:
            assert cache.get_all(name, 20) == [name.encode() + bytes([n]) for n in range(20)]

    # -- LockFreeCommits ---------------------------------------------------------------------------
    def lock_free(self, cache: CuboidCache, locks: RWLocks | None) -> tuple[LockFreeCommits, RWLocks]:
        commits = cache.lock_free
        if commits is None or locks is None:
            pytest.skip("this cache offers no lock-free commits")
        return commits, locks

    def test_a_lock_free_read_is_a_snapshot_of_what_is_resident(self, cache: CuboidCache,
                                                                locks: RWLocks | None) -> None:
        commits, _ = self.lock_free(cache, locks)
        checked(cache).put(A, {0: b"a", 1: b"b"}, 1.0, dirty=False)
        cache.put(B, {0: b"c"}, 2.0, dirty=False)
        assert commits.read_unlocked({A: [1, 0, 2], B: []}, 3.0) == {A: [b"b", b"a", None], B: []}
        assert cache.coldest(2) == [A, B] or cache.coldest(2) == [B, A]  # touched (both at 3.0)
        seen = commits.read_for_update({A: [0, 2]}, 4.0)
        assert seen is not None and seen[A][0] == [b"a", None]
        assert seen[A][1][0] is not None and seen[A][1][1] is None  # a stored blob's digest; none for none
        assert commits.read_unlocked({}, 5.0) is None

    @pytest.mark.parametrize("why", ["not resident", "lost", "an NDBlaze write recorded", "unchecked",
                                     "a writer holds its lock"])
    def test_a_lock_free_read_declines_where_it_would_not_be_safe(self, cache: CuboidCache, locks: RWLocks | None,
                                                                   why: str) -> None:
        commits, held = self.lock_free(cache, locks)
        checked(cache).put(A, {0: b"a"}, 1.0, dirty=False)
        unsafe(cache, why, A)
        if why == "a writer holds its lock":
            with held.write([A], timeout_s=10):
                assert commits.read_unlocked({A: [0]}, 2.0) is None
        else:
            assert commits.read_unlocked({A: [0]}, 2.0) is None
            assert commits.read_for_update({A: [0]}, 2.0) is None

    def test_a_lock_free_commit_is_applied_when_nothing_it_read_changed(self, cache: CuboidCache,
                                                                         locks: RWLocks | None) -> None:
        commits, _ = self.lock_free(cache, locks)
        checked(cache).put(A, {0: b"a", 1: b"b"}, 1.0, dirty=False)
        cache.put(B, {0: b"c"}, 1.0, dirty=False)
        digest = read_digest(commits, A, 0)
        cache.put(A, {1: b"another writer's, into another cuboid"}, 2.5, dirty=False)  # does not refuse it
        assert commits.commit_unlocked({A: {0: b"A", 2: b"new"}, B: {1: b"d"}}, {A: {0: digest}}, 3.0)
        assert cache.get_many({A: [0, 1, 2], B: [0, 1]}) == {
            A: [b"A", b"another writer's, into another cuboid", b"new"], B: [b"c", b"d"]}
        assert cache.is_dirty([A, B]) == [True, True] and set(cache.held().unflushed) == {A, B}
        assert cache.dirty_before(3.0, 10) == [A, B]

    @pytest.mark.parametrize("why", ["a cuboid it read changed", "not resident", "lost", "an NDBlaze write recorded",
                                     "unchecked", "a reader holds its lock", "a writer holds its lock"])
    def test_a_refused_lock_free_commit_changes_nothing(self, cache: CuboidCache, locks: RWLocks | None,
                                                        why: str) -> None:
        commits, held = self.lock_free(cache, locks)
        checked(cache).put(A, {0: b"a", 1: b"b"}, 1.0, dirty=False)
        cache.put(B, {0: b"c"}, 1.0, dirty=False)
        new, expected = {A: {0: b"A", 1: b"B"}, B: {0: b"C"}}, {A: {0: read_digest(commits, A, 0)}}
        if why == "a cuboid it read changed":
            cache.put(A, {0: b"another writer's"}, 2.5, dirty=False)
        else:
            unsafe(cache, why, A)
        before = cache.get_many({A: [0, 1], B: [0]}), cache.is_dirty([A, B]), cache.held().unflushed
        if "holds its lock" in why:
            lock = held.read if why.startswith("a reader") else held.write
            with lock([A], timeout_s=10):
                assert not commits.commit_unlocked(new, expected, 3.0)
        else:
            assert not commits.commit_unlocked(new, expected, 3.0)
        assert (cache.get_many({A: [0, 1], B: [0]}), cache.is_dirty([A, B]), cache.held().unflushed) == before


def read_digest(commits: LockFreeCommits, name: str, number: int) -> bytes:
    """The digest of a stored cuboid, as a lock-free write reads it before it merges."""
    seen = commits.read_for_update({name: [number]}, 2.0)
    assert seen is not None
    digest = seen[name][1][0]
    assert digest is not None
    return digest


def unsafe(cache: CuboidCache, why: str, name: str) -> None:
    """Make a lock-free step on ``name`` unsafe, for ``why`` (lock holders: the caller's)."""
    if why == "not resident":
        cache.evict(name)
    elif why == "lost":
        cache.mark_lost({name: "test: gone"})
    elif why == "an NDBlaze write recorded":
        cache.sync_buffered("blaze-run", 0, {})
        cache.record_buffered("blaze-run", {name: 1})
    elif why == "unchecked":
        cache.clear_epoch()
