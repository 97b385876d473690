"""The cache tier: reads and writes through the cache, written back to the base tier. It owns the
cache, the readers-writer locks and the base tier, and hands each caller a narrow port of itself
(ndstore/engine/cache/ports.py), so the coherence protocol between a cached copy and the base tier
is written once. Its parts: `loss` (loss.py), `upkeep` (write-back and eviction, writeback.py),
copies from the base tier (copies.py), the lock-free path (lock_free.py).

Read: plan the box into supercuboids; take read locks on the resident ones and write locks on
the missing ones, together (one consistent snapshot); fetch what is still missing from the base
tier (re-checked under its write lock, so concurrent misses of one supercuboid fetch it once) and
use those blobs directly; fetch just the cuboids the box touches of the others; update access
times and assemble. The fetched supercuboids are stored in the cache (paged in) after the read
has its blobs, by a background thread to which the read hands its locks: the answer does not
wait for Redis to store them, and no one can change or read them through the cache before they
are stored (see `PageIns`). Locks go when the page-in is done. A small read first tries the
lock-free snapshot (lock_free.py) where the cache offers one.
Write: under write locks, merge partly covered cuboids (of a supercuboid not resident, read from
the base tier: it is not paged in first), store the new cuboid blobs and mark the supercuboids
resident and dirty; the flusher writes them back (or, for a write-through channel, the write does
before it returns). The rest of an object the write fetched is stored after it answers, like a
read's page-in. A resident supercuboid's absent cuboids are clean (the base tier holds them);
what needs one restores them (`Copies.restore`). A small write first tries the optimistic commit.
Coherence (`read_base`, `write_base`, `rewriting`): under read locks, dirty cached copies are
written back before the base tier is read; under write locks, cached copies are written back if
dirty and dropped before the base tier is changed, so no stale copy stays readable. See
docs/design/cache-tier.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from ndstore.core.errors import DamagedInCache, InvalidBody, StorageError
from ndstore.core.geometry import Grid
from ndstore.core.keys import SupercuboidKey
from ndstore.core.observe import NULL, Observer
from ndstore.core.parallel import run_all
from ndstore.core.plan import PlannedPart
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.cache import parts
from ndstore.engine.cache.copies import Copies, PageIns
from ndstore.engine.cache.lock_free import LockFreePath
from ndstore.engine.cache.loss import Loss
from ndstore.engine.cache.parts import META, Blob, kept, merged, meta, touching, untouched
from ndstore.engine.cache.ports import (
    BufferRecord,
    Coherence,
    EvictionDaemon,
    LossAdmin,
    Operations,
    RequestPath,
    Rewrite,
    WriteBackDaemon,
)
from ndstore.engine.cache.writeback import WriteBack
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import CuboidCache, RWLocks

Array = npt.NDArray[Any]
T = TypeVar("T")
READ_BATCH = 256  # at most this many supercuboids per locked snapshot of a read (see CacheTier.read)


class CacheTier:
    def __init__(self, cache: CuboidCache, base: BaseTier, locks: RWLocks, parallelism: int = 8,
                 clock: Callable[[], float] = time.time, observer: Observer = NULL):
        """Small reads and writes go without locks when ``cache`` offers lock-free commits
        (`cache.lock_free`); otherwise every request takes locks."""
        self._observer = observer
        self._cache = cache
        self._base = base
        self._locks = locks
        self._clock = clock
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="cache-tier")
        # Per-cuboid codec work of one supercuboid (blosc releases the GIL: see core.chunks).
        self._codec = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="cache-codec")
        self._page_ins = PageIns(base.read_window_bytes, cache, observer)
        self.loss = Loss(cache, locks, base.objects, clock, observer)
        self._copies = Copies(cache, base, self._page_ins, self.loss.run, clock, observer)
        self.upkeep = WriteBack(cache, base, locks, self._copies, self.loss, self._pool, clock)
        commits = cache.lock_free
        self._lock_free = None if commits is None else LockFreePath(commits, self._pool, self._codec, clock, observer)

    # -- reads (RequestPath) -------------------------------------------------------------------
    def read(self, cutout: Cutout) -> Array:
        """The box, read a batch of supercuboids at a time (in plan order: time sample, then
        Morton), each batch a consistent snapshot under its own locks: a box over thousands of
        supercuboids (a voxel over a long time series) holds no lock longer than its batch's I/O,
        so a writer waits for one batch, not for the whole read. A batch is at most READ_BATCH
        supercuboids and at most the base tier's read window of cuboids (raw bytes, at least one
        supercuboid): a large read holds its output array and one batch of blobs, not a second
        copy of the box."""
        plan = cutout.plan()
        out = np.empty(cutout.shape, cutout.channel.dtype)
        if self._lock_free is not None and self._lock_free.read(cutout, plan, out):
            return out
        run = self.loss.guard(plan.names)
        grid = plan.grid
        planned: dict[str, list[PlannedPart]] = {}
        wanted: dict[str, list[int]] = {}
        for p in plan.parts:
            planned.setdefault(p.key.name, []).append(p)
            wanted.setdefault(p.key.name, []).extend(n for n, _, _ in touching(p.part, grid))
        for batch in self._batches(plan.keys, wanted, grid, out.dtype):
            self._read_batch(cutout, grid, batch, [p for k in batch for p in planned[k.name]],
                             {k.name: wanted[k.name] for k in batch}, out, run)
        return out

    def stored(self, cutout: Cutout) -> bytes | None:
        """The stored blob of the one cuboid that holds all of ``cutout``, as it is in the cache
        (b"": all zeros), when a lock-free snapshot can give it; else None (read it with `read`)."""
        return None if self._lock_free is None else self._lock_free.stored(cutout, cutout.plan())

    def settle(self) -> None:
        """Wait until the page-ins of earlier reads are stored (and their locks released)."""
        self._page_ins.settle()

    def _batches(self, keys: Sequence[SupercuboidKey], wanted: Mapping[str, list[int]], grid: Grid,
                 dtype: np.dtype) -> Iterator[list[SupercuboidKey]]:
        """``keys`` in order, cut into batches of at most READ_BATCH supercuboids and at most a read
        window of wanted cuboids (at least one supercuboid each)."""
        per_super = grid.cuboid_count
        room = self._base.window(grid, dtype) * per_super
        batch: list[SupercuboidKey] = []
        cuboids = 0
        for key in keys:
            count = len(wanted[key.name])
            if batch and (len(batch) == READ_BATCH or cuboids + count > room):
                yield batch
                batch, cuboids = [], 0
            batch.append(key)
            cuboids += count
        if batch:
            yield batch

    def _read_batch(self, cutout: Cutout, grid: Grid, keys: list[SupercuboidKey], planned: list[PlannedPart],
                    wanted: dict[str, list[int]], out: Array, run: str) -> None:
        names = [k.name for k in keys]
        blobs = None
        lacking: set[str] = set()
        for attempt in range(5):
            # the last try takes write locks on them all: eviction needs those too, so cannot win again
            try:
                blobs = self._read_blobs(keys, wanted, cutout.channel.dtype, grid, run, exclusive=attempt == 4,
                                         lacking=lacking)
            except DamagedInCache as exc:
                self.loss.repair(exc)
                continue
            except _Forgotten as exc:  # read again under their write locks, completed from the base tier
                lacking.update(exc.names)
                continue
            if blobs is not None:
                break
        if blobs is None:
            raise StorageError("the cache evicted this box's supercuboids faster than it could read them; try again")
        self._cache.touch(names, self._clock())
        run_all(self._pool, lambda p: parts.decode(p, blobs[p.key.name], wanted[p.key.name], grid, out, cutout,
                                                   self._codec), planned)

    def _read_blobs(self, keys: list[SupercuboidKey], wanted: dict[str, list[int]], dtype: np.dtype,
                    grid: Grid, run: str, exclusive: bool = False,
                    lacking: Set[str] = frozenset()) -> dict[str, Sequence[Blob | None]] | None:
        """One consistent snapshot of the wanted cuboids: read locks on the resident
        supercuboids and write locks on the missing ones and on those found ``lacking`` cuboids
        before (on all of them if `exclusive`), all held together; the missing ones are fetched
        (each once, whoever gets its write lock first) and their blobs used straight away, and so
        are the objects of write-locked resident ones that lack wanted cuboids. The fetched
        supercuboids are paged in (or completed) after the answer, by a `PageIns` thread that
        then releases all these locks, or, without room there, before. None when a supercuboid
        was evicted before its read lock was taken. ``run``: the cache's checked mark read before
        the fetch (`guard`); a page-in is stored only while it is still the cache's."""
        names = [k.name for k in keys]
        was_resident = dict(zip(names, [False] * len(names) if exclusive else self._cache.resident(names)))
        writes = {n for n in names if not was_resident[n] or n in lacking}
        with ExitStack() as locked:
            locked.enter_context(self._locks.mixed(reads=[n for n in names if n not in writes], writes=sorted(writes)))
            resident = dict(zip(names, self._cache.resident(names)))
            if any(n not in writes and not resident[n] for n in names):
                return None
            absent = [k for k in keys if not resident[k.name]]
            cached = [n for n in names if resident[n]]
            blobs: dict[str, Sequence[Blob | None]] = {**self._cache.get_many({n: wanted[n] for n in cached})}
            gaps = [k for k in keys if resident[k.name] and k.name in writes and None in blobs[k.name]]
            lacks = {k.name: self._copies.lacking(k.name, grid, wanted[k.name], blobs[k.name]) for k in gaps}
            room = self._page_ins.reserve(len(absent + gaps) * grid.supercuboid_bytes(dtype.itemsize)) \
                if absent or gaps else 0
            if room:  # stored after the answer, by a thread that then releases the locks
                try:
                    objects = dict(self._copies.fetched(absent + gaps, dtype, grid))
                except BaseException:
                    self._page_ins.give_back(room)
                    raise
                fetched = {k.name: kept(objects[k.name], wanted[k.name]) for k in absent}
                restored: dict[str, Mapping[int, Blob]] = {
                    name: {n: objects[name][n] for n in lack} for name, lack in lacks.items()}
                raw_meta, now = meta(dtype, grid), self._clock()
                self._page_ins.later(
                    {**{k.name: partial(self._page_ins.store, k.name, objects[k.name], raw_meta, now, run)
                        for k in absent},
                     **{name: partial(self._copies.fill, name, found, run) for name, found in restored.items()}},
                    locked.pop_all(), room)
            else:  # stored now, one object at a time, so a thin read does not hold them all
                fetched = self._copies.fetch(absent, dtype, grid, wanted, run)
                restored = {name: self._copies.restore(name, dtype, grid, lack, run) for name, lack in lacks.items()}
            for name, found in restored.items():
                blobs[name] = [found[n] if b is None else b for n, b in zip(wanted[name], blobs[name])]
        forgotten = [n for n, found in blobs.items() if None in found]
        if forgotten:
            raise _Forgotten(forgotten)
        self._observer.count("cache_reads_total", len(names) - len(fetched), outcome="hit")
        self._observer.count("cache_reads_total", len(fetched), outcome="miss")
        blobs.update(fetched)
        return blobs

    # -- writes (RequestPath) ------------------------------------------------------------------
    def write(self, cutout: Cutout, data: Array) -> None:
        if data.shape != cutout.shape or data.dtype != cutout.channel.dtype:
            raise InvalidBody(f"data {data.shape} {data.dtype} does not fit the box {cutout.shape}")
        whole = {} if self._lock_free is None else self._lock_free.write(cutout, data)
        if whole is None:
            return
        run = self.loss.guard(cutout.plan().names)
        try:
            self._write(cutout, data, run, whole)
        except DamagedInCache as exc:  # a partly covered cuboid to merge into: dropped, paged in again
            self.loss.repair(exc)
            self._write(cutout, data, run, whole)

    def _write(self, cutout: Cutout, data: Array, run: str, whole: Mapping[str, Mapping[int, bytes]]) -> None:
        """The locked write; ``whole``: blobs of whole cuboids compressed already, by supercuboid."""
        plan = cutout.plan()
        grid, keys = plan.grid, plan.keys
        touched = {p.key.name: touching(p.part, grid) for p in plan.parts}
        partly = {name: [n for n, cbox, sub in items if sub != cbox] for name, items in touched.items()}
        dtype = cutout.channel.dtype
        with self.upkeep.ledger_kept() as written_back, ExitStack() as locked:
            locked.enter_context(self._locks.write([k.name for k in keys]))
            # whether each supercuboid is resident and its partly covered cuboids, in one round
            # trip. One that is not is not paged in first: the write stores the cuboids it touches
            # (its partly covered ones merged into the base tier's, fetched), and the rest of a
            # fetched object is stored after the write returns, by a `PageIns` thread to which
            # the write hands its locks (without room there, and for what was never fetched, the
            # rest stays absent: clean cuboids the base tier holds, restored where needed)
            old: dict[str, Sequence[Blob | None] | None] = {**self._cache.get_if_resident(partly)}
            old.update({name: self._copies.completed(name, dtype, grid, partly[name], found, run)
                        for name, found in old.items() if found is not None})
            cold = [k for k in keys if old[k.name] is None and partly[k.name]]
            room = self._page_ins.reserve(len(cold) * grid.supercuboid_bytes(dtype.itemsize)) if cold else 0
            objects: dict[str, Sequence[Blob]] = {}
            try:
                for name, blobs in self._copies.fetched(cold, dtype, grid):
                    old[name] = kept(blobs, partly[name])
                    if room:
                        objects[name] = blobs
                    del blobs
                run_all(self._pool, lambda p: self._merge(p, grid, data[p.time_index][p.part.in_box(cutout.box)],
                                                          touched[p.key.name],
                                                          dict(zip(partly[p.key.name], old[p.key.name] or [])),
                                                          whole.get(p.key.name, {})),
                        plan.parts)
                rests = {name: untouched(blobs, touched[name]) for name, blobs in objects.items()}
                if rests and cutout.channel.write_through:  # written back now: complete them first
                    for name, rest in rests.items():
                        self._cache.fill(name, rest, run)
                elif rests:
                    self._page_ins.later({name: partial(self._cache.fill, name, rest, run)
                                          for name, rest in rests.items()}, locked.pop_all(), room)
                    room = 0
            finally:
                if room:
                    self._page_ins.give_back(room)
            if cutout.channel.write_through:
                written_back.extend(self.upkeep.flush_locked(key.name) for key in keys)

    def _merge(self, planned: PlannedPart, grid: Grid, src: Array, touched: Sequence[Any],
               old: dict[int, Blob | None], whole: Mapping[int, bytes]) -> None:
        new = merged(planned, grid, src, touched, old, self._codec, whole)
        self._cache.put(planned.key.name, {META: meta(src.dtype, grid), **new}, self._clock(), dirty=True)

    def purge(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel: cached copies (dirty ones too, unflushed), then every
        stored supercuboid. Returns the number of stored supercuboids deleted."""
        for name in self._cache.names_with_prefix(channel.name_prefix):
            with self._locks.write([name]):
                self._cache.evict(name)
        self.loss.accept_loss([n for n in self.loss.lost() if n.startswith(channel.name_prefix)])
        return self._base.purge(channel)

    # -- coherence with the base tier (Coherence): direct I/O, NDBlaze reads and merges -------
    @contextmanager
    def _consistent(self, names: Sequence[str]) -> Iterator[None]:
        """Read locks on `names`, dirty cached copies written back: the base tier is current."""
        with self.upkeep.ledger_kept() as written_back, self._locks.read(names):
            for name, dirty in zip(names, self._cache.is_dirty(names)):
                if dirty:
                    written_back.append(self.upkeep.flush_locked(name))
            yield

    @contextmanager
    def exclusive(self, names: Sequence[str]) -> Iterator[None]:
        """Write locks on `names`, cached copies written back if dirty and dropped: the caller may
        change these supercuboids in the base tier, and no one reads or writes them meanwhile."""
        with self.upkeep.ledger_kept() as written_back, self._locks.write(names):
            for name, resident in zip(names, self._cache.resident(names)):
                if resident:
                    written_back.append(self.upkeep.evict_locked(name))
            yield

    def read_base(self, cutout: Cutout, also: Callable[[Sequence[str]], T]) -> tuple[Array, T]:
        """The base tier's copy of the cutout, with every acknowledged write in it, and
        ``also(supercuboid names)`` called under the same read locks: one snapshot that no
        writer of those supercuboids can change in between."""
        names = cutout.plan().names
        self.loss.guard(names)
        with self._consistent(names):
            return self._base.read(cutout), also(names)

    def read_raw(self, cutout: Cutout) -> Array:
        """The base tier as it is, dirty cached data ignored (`?access-mode=raw`)."""
        return self._base.read(cutout)

    def write_base(self, cutout: Cutout, data: Array) -> None:
        """Write straight to the base tier, leaving no cached copy of what it changes."""
        self.loss.guard(cutout.plan().names)
        with self.exclusive(cutout.plan().names):
            self._base.write_locked(cutout, data)

    @contextmanager
    def rewriting(self, key: SupercuboidKey) -> Iterator[Rewrite]:
        """One supercuboid to read whole from the base tier and store back, under its write lock
        with no cached copy left (the NDBlaze merge)."""
        with self.exclusive([key.name]):
            yield Rewrite(self._base, key)

    def write_back(self, prefix: str) -> int:
        """Flush every dirty cached supercuboid whose name starts with `prefix` (a channel, a
        level of it): the base tier and its index then hold all of it."""
        return self.upkeep.write_back(prefix)

    # -- the daemons' ports (WriteBackDaemon, EvictionDaemon), passed on to `upkeep`: the
    # services hand the tier itself to the flusher and the cache manager ------------------------
    def check_ledger(self) -> None:
        self.upkeep.check_ledger()

    def due_for_write_back(self, age_s: float, limit: int) -> list[str]:
        return self.upkeep.due_for_write_back(age_s, limit)

    def flush(self, names: Sequence[str]) -> int:
        return self.upkeep.flush(names)

    def keep_ledger(self, final: bool = False) -> None:
        self.upkeep.keep_ledger(final)

    def memory_used(self) -> int:
        return self.upkeep.memory_used()

    def coldest(self, count: int) -> list[str]:
        return self.upkeep.coldest(count)

    def evict(self, name: str, lock_timeout_s: float) -> bool:
        return self.upkeep.evict(name, lock_timeout_s)


class _Forgotten(Exception):
    """Resident supercuboids lacking cuboids a read wanted: to restore (`Copies.restore`)."""

    def __init__(self, names: list[str]):
        super().__init__(", ".join(names))
        self.names = names


if TYPE_CHECKING:  # mypy checks that the tier and its parts implement the ports their callers get
    def _ports(tier: CacheTier) -> tuple[RequestPath, Coherence, WriteBackDaemon, EvictionDaemon, Operations,
                                         LossAdmin, BufferRecord, WriteBackDaemon, EvictionDaemon]:
        return tier, tier, tier.upkeep, tier.upkeep, tier.upkeep, tier.loss, tier.loss, tier, tier
