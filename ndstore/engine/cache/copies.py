"""Copies of base-tier objects in the cache: supercuboids fetched and paged in (before a read
answers, or after it by `PageIns`), and the cuboids a resident supercuboid lacks restored
(`Copies.restore`).

A page-in is not logged (RedisCuboidCache.page_in), so a Redis that restarted from its AOF holds
of a written supercuboid only what writes stored: a resident supercuboid's absent cuboid is
clean, and the base tier holds it as it was paged in. Whatever needs one restores it from the
object (docs/design/cache-tier.md, "Page-ins are not logged"). Every copy is stored only in the
cache's run it was fetched in (the checked mark `Loss.guard` read before the fetch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack

import numpy as np

from ndstore.core.geometry import Grid
from ndstore.core.keys import SupercuboidKey
from ndstore.core.observe import NULL, Observer
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache.parts import META, Blob, cuboids_of, kept, meta
from ndstore.storage.interfaces import Residency

log = logging.getLogger(__name__)


class PageIns:
    """Page-ins that finish after their read (or write) has answered. Storing a fetched supercuboid
    in Redis (copying ~14 MB of cuboids into it) took about a third of a cold 16 MiB read's time,
    during which the read's thread only waited. The read hands its locks to a thread here, which
    stores the supercuboids and then releases them: until then their write locks keep every other
    reader and writer out (they wait, then find them resident), so a page-in still copies what the
    base tier holds, and nothing else can see them half stored. A write into a supercuboid not
    resident hands over the rest of the object it fetched the same way. The
    objects such page-ins hold are counted against ``room`` bytes (raw supercuboids) per process;
    a read that would exceed it stores its page-ins before it answers, as before (a write leaves
    the rest absent, restored where needed). A page-in that fails here leaves its supercuboids
    not resident (the next read pages them in again), and a write's rest absent: the read's
    answer came from the base tier and stays right, and the write's cuboids were stored."""

    def __init__(self, room: int, cache: Residency, observer: Observer):
        self._cache = cache
        self._observer = observer
        self._room = room
        self._held = 0
        self._pending: set[Future[None]] = set()
        self._guard = threading.Lock()
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="cache-page-in")

    def reserve(self, nbytes: int) -> int:
        """``nbytes`` reserved for page-ins after the answer (returned by their `later`, or
        `give_back`), or 0 if there is no room."""
        with self._guard:
            if self._held + nbytes > self._room:
                return 0
            self._held += nbytes
            return nbytes

    def give_back(self, reserved: int) -> None:
        with self._guard:
            self._held -= reserved

    def later(self, stores: Mapping[str, Callable[[], None]], locks: ExitStack, reserved: int) -> None:
        """Run ``stores`` (supercuboid name -> what stores it) on a thread of their own, then close
        ``locks`` and give back ``reserved``."""
        try:
            future = self._threads.submit(self._store_and_release, stores, locks, reserved)
        except RuntimeError:  # the interpreter is shutting down: store them now
            self._store_and_release(stores, locks, reserved)
            return
        with self._guard:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._guard:
            self._pending.discard(future)

    def store(self, name: str, blobs: Sequence[Blob], raw_meta: bytes, now: float, run: str) -> None:
        """Page in one fetched supercuboid now, if the cache is still in ``run``."""
        self._cache.page_in(name, {META: raw_meta, **dict(enumerate(blobs))}, now, run)

    def _store_and_release(self, stores: Mapping[str, Callable[[], None]], locks: ExitStack, reserved: int) -> None:
        stored = 0
        try:
            for store in stores.values():
                store()
                stored += 1
        except Exception:
            self._observer.count("cache_page_in_failures_total", len(stores) - stored)
            log.warning("storing %d supercuboids fetched for a read or write that answered first failed; what they "
                        "lack stays out of the cache (read from the base tier when needed)", len(stores) - stored,
                        exc_info=True)
        finally:
            locks.close()
            self.give_back(reserved)

    def settle(self) -> None:
        """Wait for the page-ins handed over so far."""
        with self._guard:
            pending = list(self._pending)
        wait(pending)


class Copies:
    """Fetches from the base tier into the cache. The caller holds the supercuboids' locks (a
    write lock to page in; a read lock is enough to restore, see `restore`)."""

    def __init__(self, cache: Residency, base: BaseTier, page_ins: PageIns, run: Callable[[], str],
                 clock: Callable[[], float] = time.time, observer: Observer = NULL):
        """``run``: the cache's checked mark now ("" when there is none), for a restore whose
        caller read none."""
        self._cache = cache
        self._base = base
        self.page_ins = page_ins
        self._run = run
        self._clock = clock
        self._observer = observer

    def fetched(self, keys: Sequence[SupercuboidKey], dtype: np.dtype,
                grid: Grid) -> Iterator[tuple[str, Sequence[Blob]]]:
        """Each supercuboid's cuboid blobs as stored in the base tier (views of its object), a read
        window of them fetched at once."""
        if not keys:
            return
        by_object = {k.object_key: k for k in keys}
        count = grid.cuboid_count
        for object_key, obj in self._base.objects.get_many(list(by_object), self._base.window(grid, dtype)):
            yield by_object[object_key].name, cuboids_of(obj, dtype, count)

    def fetch(self, keys: Sequence[SupercuboidKey], dtype: np.dtype, grid: Grid,
              keep: Mapping[str, Sequence[int]], run: str) -> dict[str, list[Blob]]:
        """Page supercuboids in now, a read window of them fetched at once; return the blobs of
        the cuboids ``keep`` names in each (`kept`)."""
        now = self._clock()
        fetched: dict[str, list[Blob]] = {}
        for name, blobs in self.fetched(keys, dtype, grid):
            self.page_ins.store(name, blobs, meta(dtype, grid), now, run)
            fetched[name] = kept(blobs, keep[name])
            del blobs
        return fetched

    def completed(self, name: str, dtype: np.dtype, grid: Grid, numbers: Sequence[int],
                  found: Sequence[Blob | None], run: str | None = None) -> list[Blob | None]:
        """``found`` (the blobs of cuboids ``numbers``), with any the cache forgot restored."""
        if all(b is not None for b in found):
            return list(found)
        restored = self.restore(name, dtype, grid, self.lacking(name, grid, numbers, found), run)
        return [restored[n] if b is None else b for n, b in zip(numbers, found)]

    def lacking(self, name: str, grid: Grid, numbers: Sequence[int], found: Sequence[Blob | None]) -> list[int]:
        """What a restore of a resident supercuboid fetches: the cuboids it lacks now, and those
        ``found`` lacked (the blobs of ``numbers``) whatever happened since. Under a read lock
        another restore may store them between the two looks; the caller still needs them."""
        absent = self._cache.absent(name, range(grid.cuboid_count))
        return sorted({*absent, *(n for n, b in zip(numbers, found) if b is None)})

    def restore(self, name: str, dtype: np.dtype, grid: Grid, lacking: Sequence[int],
                run: str | None = None) -> dict[int, bytes]:
        """Cuboids ``lacking`` of a resident supercuboid (`lacking`), read from the base tier and
        stored where they are still absent (unlogged, as a page-in's); returns every one of them,
        from the object fetched. A cuboid absent from a resident supercuboid was not written
        since it became resident: a write to a supercuboid not resident stores only the cuboids it
        touches, and page-ins are not logged, so a Redis that restarted from its AOF holds only
        what writes stored. The base tier holds it as it was then (the base tier changes under a
        cached supercuboid only by its write-back, or after its eviction, which is logged). The
        caller holds its write lock, or a read lock: then the only other writer of these fields
        is another restore, storing the same bytes (and `fill` sets only absent fields). Never a
        second look at what is absent decides what is returned: a concurrent restore may have
        stored them meanwhile. Stored only in ``run`` (the caller's `guard`; None: the mark as
        it is now, before the fetch)."""
        if not lacking:
            return {}
        if run is None:
            run = self._run()
        _, blobs = next(self.fetched([SupercuboidKey.from_name(name)], dtype, grid))
        restored = {n: bytes(blobs[n]) for n in lacking}
        self.fill(name, restored, run)
        return restored

    def fill(self, name: str, restored: Mapping[int, Blob], run: str) -> None:
        """Store a restore's cuboids (its last step, before the answer or after it), counted and logged."""
        self._cache.fill(name, restored, run)
        self._observer.count("cache_restores_total", len(restored))
        log.info("restored %d clean cuboids of %s from the base tier", len(restored), name)
