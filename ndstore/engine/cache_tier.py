"""The cache tier: reads and writes through Redis, written back to the base tier. It owns the
cache, the readers-writer locks and the base tier: everything else (direct I/O, NDBlaze reads
and merges, the flusher and the cache manager, downsampling, purges) calls the small surface
below, so the coherence protocol between a cached copy and the base tier is written once.

Small read and write (locks in the cache's own Redis; a read of at most SNAPSHOT_CUBOIDS cuboids,
a write of at most LOCK_FREE_WRITE_CUBOIDS of which at most LOCK_FREE_MERGE_CUBOIDS partly covered,
whose new blobs come to at most LOCK_FREE_WRITE_BYTES): no lock is taken. A read is one script that
reads the cuboids as an atomic snapshot when every supercuboid is resident, none is lost and no
writer holds one. A write compresses its whole cuboids, reads the partly covered cuboids so (with
their digests), merges, and commits only if no one holds a lock on them and those cuboids still
have the digests it read (optimistic: two round trips instead of five; the commit is one MULTI
that does not copy the cuboids into Lua, see RedisCuboidCache.commit_unlocked). Otherwise, and
for every larger request, the locked read and write below (a write that tried first hands on the
whole cuboids it compressed: none is compressed twice).
Read: plan the box into supercuboids; take read locks on the resident ones and write locks on
the missing ones, together (one consistent snapshot); fetch what is still missing from the base
tier (re-checked under its write lock, so concurrent misses of one supercuboid fetch it once) and
use those blobs directly; fetch just the cuboids the box touches of the others; update access
times and assemble. The fetched supercuboids are stored in the cache (paged in) after the read
has its blobs, by a background thread to which the read hands its locks: the answer does not
wait for Redis to store them, and no one can change or read them through the cache before they
are stored (see `_PageIns`). Locks go when the page-in is done.
Write: under write locks, merge partly covered cuboids (of a supercuboid not resident, read from
the base tier: it is not paged in first), store the new cuboid blobs and mark the supercuboids
resident and dirty; the flusher writes them back (or, for a write-through channel, the write does
before it returns). The rest of an object the write fetched is stored after it answers, like a
read's page-in. A resident supercuboid's absent cuboids are clean (the base tier holds them);
what needs one restores them (`_restore`).
Coherence (`read_base`, `write_base`, `rewrite_supercuboid`): under read locks, dirty cached
copies are written back before the base tier is read; under write locks, cached copies are
written back if dirty and dropped before the base tier is changed, so no stale copy stays
readable. See docs/design/cache-tier.md.
Loss: reads and writes first check that the cache Redis carries its checked mark and that none
of their supercuboids is marked lost (one round trip); a Redis found without its mark is checked
against its ledger by whoever finds it (`verify`, ndstore/engine/ledger.py). A cached cuboid that
fails its checksum is dropped and paged in again when it was clean, marked lost when it was dirty.
The cache Redis also keeps the record of NDBlaze writes not yet merged (`record_buffered`): a
request touching one of those supercuboids has the NDBlaze buffer's run checked too (`watch_buffer`),
so no path answers for it from a buffer that came back without it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ndstore.core.chunks import (
    compress_cuboid,
    cuboids_touching,
    decode_blobs_region,
    decompress_cuboid,
    join_supercuboid,
    split_supercuboid,
)
from ndstore.core.errors import DamagedInCache, DataCorrupt, DataLost, InvalidBody, StorageError
from ndstore.core.geometry import CUBOID_BYTES, Grid, SupercuboidPart
from ndstore.core.keys import SupercuboidKey
from ndstore.core.observe import NULL, Observer
from ndstore.core.parallel import map_ordered, run_all
from ndstore.core.plan import Plan, PlannedPart
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.ledger import NAMES_IN_MESSAGES, LedgerBook, LedgerKeeper, Verdict
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import CuboidCache, ObjectStore, RWLocks

log = logging.getLogger(__name__)
Array = npt.NDArray[Any]
Blob = bytes | memoryview  # a cuboid's blosc bytes, or a view of them in a fetched supercuboid object
T = TypeVar("T")
READ_BATCH = 256  # at most this many supercuboids per locked snapshot of a read (see CacheTier.read)
# Reads of at most a supercuboid's worth of cuboids (16 MiB) go without locks (see above): faster
# and cheaper in CPU at every size up to it (docs/design/serving.md, "Which requests go without locks"). Up to
# SERIAL_DECODE_CUBOIDS they are decoded in the request's thread: a hop to the codec pool and back
# costs more than a few decodes.
SNAPSHOT_CUBOIDS = 64
SERIAL_DECODE_CUBOIDS = 16
# A write merges (decodes, overwrites, encodes) up to these many cuboids in the request's thread:
# a 64x64x8 annotation stroke touches at most 2x2x2 cuboids, and under load the codec pool's hop
# cost it more CPU than it saved (serving.md, "Work in the request's thread"). More (a large write's) go to the pool.
SERIAL_MERGE_CUBOIDS = 8
# A lock-free write first reads the cuboids it covers partly: at most these many (4 MiB of uint8).
LOCK_FREE_MERGE_CUBOIDS = 16
# Writes go without locks up to a supercuboid's worth of cuboids when their new blobs fit what 16
# incompressible cuboids take (so a supercuboid of labels does, and one of EM voxels does not): a
# commit is one transaction, which Redis buffers whole for its AOF, and one of 16 MiB took 1.4-1.8x
# as long as the locked path's commands of 2 MiB (serving.md, "Which requests go without locks").
LOCK_FREE_WRITE_CUBOIDS = 64
LOCK_FREE_WRITE_BYTES = 16 * (CUBOID_BYTES + 1024)  # room for blosc's header on each
META = -1  # cache field holding "dtype cuboid-shape counts", so the flusher needs no metadata DB


def _meta(dtype: np.dtype, grid: Grid) -> bytes:
    return " ".join([dtype.str, *map(str, grid.cuboid), *map(str, grid.cuboids_per_super)]).encode()


def _parse_meta(raw: bytes) -> tuple[np.dtype, Grid]:
    dtype, *dims = raw.decode().split()
    v = [int(d) for d in dims]
    return np.dtype(dtype), Grid((v[0], v[1], v[2]), (v[3], v[4], v[5]))


@dataclass(frozen=True)
class Rewrite:
    """A supercuboid its holder may read and store: it holds its write lock, uncached."""

    base: BaseTier
    key: SupercuboidKey

    def read(self, grid: Grid, dtype: np.dtype) -> Array:
        """The whole supercuboid, (z, y, x), zeros where nothing is stored."""
        return self.base.read_supercuboid(self.key, grid, dtype)

    def store(self, whole: Array, grid: Grid) -> None:
        self.base.store_array(self.key, whole, grid)


class CacheTier:
    def __init__(self, cache: CuboidCache, base: BaseTier, locks: RWLocks, parallelism: int = 8,
                 clock: Callable[[], float] = time.time, observer: Observer = NULL,
                 lock_keys: Callable[[str], tuple[str, str]] | None = None):
        """``lock_keys``: a supercuboid lock's (readers, writer) keys, when ``locks`` keep their
        keys in the cache's own Redis: small reads and writes then go without locks (see the
        module's docstring). None: every request takes locks."""
        self._lock_keys = lock_keys
        self._observer = observer
        self._cache = cache
        self._base = base
        self._locks = locks
        self._clock = clock
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="cache-tier")
        # Per-cuboid codec work of one supercuboid (blosc releases the GIL: see core.chunks).
        self._codec = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="cache-codec")
        self._page_ins = _PageIns(base.read_window_bytes, cache, observer)
        self._buffer_check: Callable[[str], bool] | None = None  # see `watch_buffer`
        self.ledger = LedgerKeeper("cache", cache, LedgerBook(base.objects, "cache"), self.ledger_lock("cache"),
                                   self._drop_all_but, cache.mark_lost, cache.lost, clock, observer)

    # -- reads -------------------------------------------------------------------------------
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
        if self._read_unlocked(cutout, plan, out):
            return out
        run = self.guard(plan.names)
        grid = plan.grid
        parts: dict[str, list[PlannedPart]] = {}
        wanted: dict[str, list[int]] = {}
        for planned in plan.parts:
            parts.setdefault(planned.key.name, []).append(planned)
            wanted.setdefault(planned.key.name, []).extend(n for n, _, _ in self._touching(planned.part, grid))
        for batch in self._batches(plan.keys, wanted, grid, out.dtype):
            self._read_batch(cutout, grid, batch, [p for k in batch for p in parts[k.name]],
                             {k.name: wanted[k.name] for k in batch}, out, run)
        return out

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

    def _read_unlocked(self, cutout: Cutout, plan: Plan, out: Array) -> bool:
        """The lock-free snapshot of a small read into ``out``; False when it does not apply
        (too many cuboids, no writer keys) or Redis declined it (then nothing was written)."""
        if self._lock_keys is None or len(plan.parts) > SNAPSHOT_CUBOIDS:
            return False
        wanted = {p.key.name: [n for n, _, _ in self._touching(p.part, plan.grid)] for p in plan.parts}
        count = sum(len(numbers) for numbers in wanted.values())
        if count > SNAPSHOT_CUBOIDS:
            return False
        try:
            blobs = self._cache.read_unlocked(wanted, {n: self._lock_keys(n)[1] for n in wanted}, self._clock())
        except DamagedInCache:
            return False  # the locked read finds it again and repairs it
        if blobs is None or any(b is None for found in blobs.values() for b in found):
            return False
        self._observer.count("cache_reads_total", len(wanted), outcome="hit")
        for p in plan.parts:
            self._decode(p, blobs[p.key.name], wanted[p.key.name], plan.grid, out, cutout,
                         serial=count <= SERIAL_DECODE_CUBOIDS)
        return True

    def _read_batch(self, cutout: Cutout, grid: Grid, keys: list[SupercuboidKey], parts: list[PlannedPart],
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
                self._repair(exc)
                continue
            except _Forgotten as exc:  # read again under their write locks, completed from the base tier
                lacking.update(exc.names)
                continue
            if blobs is not None:
                break
        if blobs is None:
            raise StorageError("the cache evicted this box's supercuboids faster than it could read them; try again")
        self._cache.touch(names, self._clock())
        run_all(self._pool, lambda p: self._decode(p, blobs[p.key.name], wanted[p.key.name], grid, out, cutout),
                parts)

    def _read_blobs(self, keys: list[SupercuboidKey], wanted: dict[str, list[int]], dtype: np.dtype,
                    grid: Grid, run: str, exclusive: bool = False,
                    lacking: Set[str] = frozenset()) -> dict[str, Sequence[Blob | None]] | None:
        """One consistent snapshot of the wanted cuboids: read locks on the resident
        supercuboids and write locks on the missing ones and on those found ``lacking`` cuboids
        before (on all of them if `exclusive`), all held together; the missing ones are fetched
        (each once, whoever gets its write lock first) and their blobs used straight away, and so
        are the objects of write-locked resident ones that lack wanted cuboids. The fetched
        supercuboids are paged in (or completed) after the answer, by a `_PageIns` thread that
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
            lacks = {k.name: self._lacking(k.name, grid, wanted[k.name], blobs[k.name]) for k in gaps}
            room = self._page_ins.reserve(len(absent + gaps) * grid.supercuboid_bytes(dtype.itemsize)) \
                if absent or gaps else 0
            if room:  # stored after the answer, by a thread that then releases the locks
                try:
                    objects = dict(self._fetched(absent + gaps, dtype, grid))
                except BaseException:
                    self._page_ins.give_back(room)
                    raise
                fetched = {k.name: _kept(objects[k.name], wanted[k.name]) for k in absent}
                restored: dict[str, Mapping[int, Blob]] = {
                    name: {n: objects[name][n] for n in lack} for name, lack in lacks.items()}
                meta, now = _meta(dtype, grid), self._clock()
                self._page_ins.later(
                    {**{k.name: partial(self._page_ins.store, k.name, objects[k.name], meta, now, run) for k in absent},
                     **{name: partial(self._fill, name, found, run) for name, found in restored.items()}},
                    locked.pop_all(), room)
            else:  # stored now, one object at a time, so a thin read does not hold them all
                fetched = self._fetch(absent, dtype, grid, wanted, run)
                restored = {name: self._restore(name, dtype, grid, lack, run) for name, lack in lacks.items()}
            for name, found in restored.items():
                blobs[name] = [found[n] if b is None else b for n, b in zip(wanted[name], blobs[name])]
        forgotten = [n for n, found in blobs.items() if None in found]
        if forgotten:
            raise _Forgotten(forgotten)
        self._observer.count("cache_reads_total", len(names) - len(fetched), outcome="hit")
        self._observer.count("cache_reads_total", len(fetched), outcome="miss")
        blobs.update(fetched)
        return blobs

    @staticmethod
    def _touching(part: SupercuboidPart, grid: Grid) -> Sequence[Any]:
        return cuboids_touching(part.local_region(grid), grid.cuboid, grid.cuboids_per_super)

    def _decode(self, planned: PlannedPart, blobs: Sequence[Blob | None], numbers: list[int], grid: Grid, out: Array,
                cutout: Cutout, serial: bool = False) -> None:
        if any(b is None for b in blobs):
            raise StorageError(f"cuboids of supercuboid {planned.key.name} vanished from the cache; try again")
        decode_blobs_region(dict(zip(numbers, blobs)), grid.cuboid, grid.cuboids_per_super,  # type: ignore[arg-type]
                            planned.part.local_region(grid), out[planned.time_index][planned.part.in_box(cutout.box)],
                            map if serial else partial(map_ordered, self._codec))

    def _fetch(self, keys: Sequence[SupercuboidKey], dtype: np.dtype, grid: Grid,
               keep: Mapping[str, Sequence[int]], run: str) -> dict[str, list[Blob]]:
        """Copy supercuboids from the base tier into the cache, a read window of them fetched at
        once; return the blobs of the cuboids ``keep`` names in each: views of the fetched object
        when they are most of it, copies when they are a few, so the object is not held for them."""
        now = self._clock()
        fetched: dict[str, list[Blob]] = {}
        for name, blobs in self._fetched(keys, dtype, grid):
            self._page_ins.store(name, blobs, _meta(dtype, grid), now, run)
            fetched[name] = _kept(blobs, keep[name])
            del blobs
        return fetched

    def _fetched(self, keys: Sequence[SupercuboidKey], dtype: np.dtype,
                 grid: Grid) -> Iterator[tuple[str, Sequence[Blob]]]:
        """Each supercuboid's cuboid blobs as stored in the base tier (views of its object), a read
        window of them fetched at once."""
        if not keys:
            return
        by_object = {k.object_key: k for k in keys}
        count = grid.cuboid_count
        for object_key, obj in self._base.objects.get_many(list(by_object), self._base.window(grid, dtype)):
            yield by_object[object_key].name, _cuboids_of(obj, dtype, count)

    # -- writes ------------------------------------------------------------------------------
    def write(self, cutout: Cutout, data: Array) -> None:
        if data.shape != cutout.shape or data.dtype != cutout.channel.dtype:
            raise InvalidBody(f"data {data.shape} {data.dtype} does not fit the box {cutout.shape}")
        whole = self._write_unlocked(cutout, data)
        if whole is None:
            return
        run = self.guard(cutout.plan().names)
        try:
            self._write(cutout, data, run, whole)
        except DamagedInCache as exc:  # a partly covered cuboid to merge into: dropped, paged in again
            self._repair(exc)
            self._write(cutout, data, run, whole)

    def _write_unlocked(self, cutout: Cutout, data: Array) -> dict[str, dict[int, bytes]] | None:
        """The optimistic small write (see the module's docstring): None once committed. Otherwise
        (it does not apply, its blobs are too many bytes for one transaction, or something it read
        changed before it could commit: then it stored nothing) the blobs of the whole cuboids it
        compressed, by supercuboid, for the locked write to store."""
        plan = cutout.plan()
        if self._lock_keys is None or cutout.channel.write_through or len(plan.parts) > LOCK_FREE_WRITE_CUBOIDS:
            return {}
        grid = plan.grid
        touching = {p.key.name: self._touching(p.part, grid) for p in plan.parts}
        partly = {name: [n for n, cbox, sub in items if sub != cbox] for name, items in touching.items()}
        if sum(len(items) for items in touching.values()) > LOCK_FREE_WRITE_CUBOIDS or \
                sum(len(numbers) for numbers in partly.values()) > LOCK_FREE_MERGE_CUBOIDS:
            return {}
        pieces = {p.key.name: (p, data[p.time_index][p.part.in_box(cutout.box)]) for p in plan.parts}

        def whole_of(name: str) -> dict[int, bytes]:  # its whole cuboids compressed, as the locked write would
            p, src = pieces[name]
            return self._merged(p, grid, src, [t for t in touching[name] if t[2] == t[1]], old={})

        whole = dict(zip(pieces, map_ordered(self._pool, whole_of, list(pieces))))
        if _nbytes(whole) > LOCK_FREE_WRITE_BYTES:
            return whole
        keys = {name: self._lock_keys(name) for name in touching}
        try:
            seen = self._cache.read_for_update(partly, {n: k[1] for n, k in keys.items()}, self._clock())
        except DamagedInCache:
            return whole  # the locked write finds it again and repairs it
        if seen is None or any(v is None for blobs, digests in seen.values() for v in blobs + digests):
            return whole  # not resident, lost, locked, or a blob stored before digests were
        new = {name: {META: _meta(data.dtype, grid), **whole[name],
                      **self._merged(p, grid, src, [t for t in touching[name] if t[2] != t[1]],
                                     dict(zip(partly[name], seen[name][0])))}
               for name, (p, src) in pieces.items()}
        if _nbytes(new) > LOCK_FREE_WRITE_BYTES:
            return whole
        expected = {name: dict(zip(partly[name], seen[name][1])) for name in partly}
        return None if self._cache.commit_unlocked(new, expected, keys, self._clock()) else whole

    def _write(self, cutout: Cutout, data: Array, run: str, whole: Mapping[str, Mapping[int, bytes]]) -> None:
        """The locked write; ``whole``: blobs of whole cuboids compressed already, by supercuboid."""
        plan = cutout.plan()
        grid, keys = plan.grid, plan.keys
        touching = {p.key.name: self._touching(p.part, grid) for p in plan.parts}
        partly = {name: [n for n, cbox, sub in items if sub != cbox] for name, items in touching.items()}
        dtype = cutout.channel.dtype
        with self._ledger_kept() as written_back, ExitStack() as locked:
            locked.enter_context(self._locks.write([k.name for k in keys]))
            # whether each supercuboid is resident and its partly covered cuboids, in one round
            # trip. One that is not is not paged in first: the write stores the cuboids it touches
            # (its partly covered ones merged into the base tier's, fetched), and the rest of a
            # fetched object is stored after the write returns, by a `_PageIns` thread to which
            # the write hands its locks (without room there, and for what was never fetched, the
            # rest stays absent: clean cuboids the base tier holds, restored where needed)
            old: dict[str, Sequence[Blob | None] | None] = {**self._cache.get_if_resident(partly)}
            old.update({name: self._completed(name, dtype, grid, partly[name], found, run)
                        for name, found in old.items() if found is not None})
            cold = [k for k in keys if old[k.name] is None and partly[k.name]]
            room = self._page_ins.reserve(len(cold) * grid.supercuboid_bytes(dtype.itemsize)) if cold else 0
            objects: dict[str, Sequence[Blob]] = {}
            try:
                for name, blobs in self._fetched(cold, dtype, grid):
                    old[name] = _kept(blobs, partly[name])
                    if room:
                        objects[name] = blobs
                    del blobs
                run_all(self._pool, lambda p: self._merge(p, grid, data[p.time_index][p.part.in_box(cutout.box)],
                                                          touching[p.key.name],
                                                          dict(zip(partly[p.key.name], old[p.key.name] or [])),
                                                          whole.get(p.key.name, {})),
                        plan.parts)
                rests = {name: _untouched(blobs, touching[name]) for name, blobs in objects.items()}
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
                written_back.extend(self._flush_locked(key.name) for key in keys)

    def _merge(self, planned: PlannedPart, grid: Grid, src: Array, touching: Sequence[Any],
               old: dict[int, Blob | None], whole: Mapping[int, bytes]) -> None:
        new = self._merged(planned, grid, src, touching, old, whole)
        self._cache.put(planned.key.name, {META: _meta(src.dtype, grid), **new}, self._clock(), dirty=True)

    def _merged(self, planned: PlannedPart, grid: Grid, src: Array, touching: Sequence[Any],
                old: Mapping[int, Blob | None], whole: Mapping[int, bytes] | None = None) -> dict[int, bytes]:
        """The new blobs of the ``touching`` cuboids of ``src``: whole ones compressed (or taken
        from ``whole``, compressed already), partly covered ones merged into their ``old`` blob."""
        part = planned.part
        shape = (grid.cuboid[2], grid.cuboid[1], grid.cuboid[0])
        local = part.local_region(grid)

        def merged(item: tuple[int, Any, Any]) -> tuple[int, bytes]:
            n, cbox, sub = item
            piece = src[sub.slices_zyx(local.lo)]
            if sub == cbox:
                return n, compress_cuboid(piece)
            cuboid = decompress_cuboid(old[n] or b"", src.dtype, shape)  # a fresh array of its own
            cuboid[sub.slices_zyx(cbox.lo)] = piece
            return n, compress_cuboid(cuboid)

        # only the cuboids with work to do go to the pool: a hand-off costs more than a lookup
        done = {n: whole[n] for n, _, _ in touching if n in whole} if whole else {}
        work = [t for t in touching if t[0] not in done]
        return {**done, **dict(map_ordered(self._codec, merged, work, inline_up_to=SERIAL_MERGE_CUBOIDS))}

    # -- coherence with the base tier: direct I/O, NDBlaze reads and merges --------------------
    @contextmanager
    def _consistent(self, names: Sequence[str]) -> Iterator[None]:
        """Read locks on `names`, dirty cached copies written back: the base tier is current."""
        with self._ledger_kept() as written_back, self._locks.read(names):
            for name, dirty in zip(names, self._cache.is_dirty(names)):
                if dirty:
                    written_back.append(self._flush_locked(name))
            yield

    @contextmanager
    def exclusive(self, names: Sequence[str]) -> Iterator[None]:
        """Write locks on `names`, cached copies written back if dirty and dropped: the caller may
        change these supercuboids in the base tier, and no one reads or writes them meanwhile."""
        with self._ledger_kept() as written_back, self._locks.write(names):
            for name, resident in zip(names, self._cache.resident(names)):
                if resident:
                    written_back.append(self._evict_locked(name))
            yield

    def read_base(self, cutout: Cutout, also: Callable[[Sequence[str]], T]) -> tuple[Array, T]:
        """The base tier's copy of the cutout, with every acknowledged write in it, and
        ``also(supercuboid names)`` called under the same read locks: one snapshot that no
        writer of those supercuboids can change in between."""
        names = cutout.plan().names
        self.guard(names)
        with self._consistent(names):
            return self._base.read(cutout), also(names)

    def read_raw(self, cutout: Cutout) -> Array:
        """The base tier as it is, dirty cached data ignored (`?access-mode=raw`)."""
        return self._base.read(cutout)

    def write_base(self, cutout: Cutout, data: Array) -> None:
        """Write straight to the base tier, leaving no cached copy of what it changes."""
        self.guard(cutout.plan().names)
        with self.exclusive(cutout.plan().names):
            self._base.write_locked(cutout, data)

    @contextmanager
    def rewriting(self, key: SupercuboidKey) -> Iterator[Rewrite]:
        """One supercuboid to read whole from the base tier and store back, under its write lock
        with no cached copy left (the NDBlaze merge)."""
        with self.exclusive([key.name]):
            yield Rewrite(self._base, key)

    # -- write-back and eviction: the daemons ---------------------------------------------------
    def _flush_locked(self, name: str) -> bool:
        """Write one resident supercuboid back to the base tier and mark it clean (True). The
        caller holds its read or write lock, so no write can slip in between. A dirty supercuboid
        whose cuboids are gone or damaged is marked lost, never written back as it is (False)."""
        try:
            meta = self._cache.get_many({name: [META]})[name][0]
            if meta is None:
                raise DamagedInCache(name, "it is marked dirty but its cuboids are gone from the cache Redis")
            dtype, grid = _parse_meta(meta)
            count = grid.cuboid_count
            blobs = self._completed(name, dtype, grid, range(count), self._cache.get_all(name, count))
        except DamagedInCache as exc:
            self._mark_lost({name: f"{exc} (found {time.strftime('%Y-%m-%d %H:%M:%S')})"})
            self._cache.clear_dirty(name)
            return False
        self._base.store(SupercuboidKey.from_name(name),
                         join_supercuboid([bytes(b or b"") for b in blobs], dtype, grid.cuboid, grid.cuboids_per_super))
        self._cache.clear_dirty(name)
        return True

    @contextmanager
    def _ledger_kept(self) -> Iterator[list[bool]]:
        """For a write-back outside the flusher's rounds (a direct write or read, a merge, an
        eviction, a write-through): the caller appends True for each supercuboid it wrote back;
        on the way out, after the supercuboid locks taken inside are released, the ledger is
        brought up to date, so a loss of the cache Redis before the next round does not name
        them lost."""
        written_back: list[bool] = []
        try:
            yield written_back
        finally:
            if any(written_back):
                try:
                    self.ledger.keep()
                except StorageError as exc:
                    log.warning("the cache ledger was not brought up to date after a write-back (the flusher's "
                                "next round will): %s", exc)

    def flush(self, names: Sequence[str]) -> int:
        """Flush the named supercuboids that are still dirty, each under its read lock."""
        def one(name: str) -> int:
            with self._locks.read([name]):
                if self._cache.is_dirty([name])[0]:
                    self._flush_locked(name)
                    return 1
            return 0
        return sum(self._pool.map(one, names))

    def due_for_write_back(self, age_s: float, limit: int) -> list[str]:
        """Supercuboids dirty for longer than `age_s`, oldest first."""
        return self._cache.dirty_before(self._clock() - age_s, limit)

    def write_back(self, prefix: str) -> int:
        """Flush every dirty cached supercuboid whose name starts with `prefix` (a channel, a
        level of it): the base tier and its index then hold all of it."""
        return self.flush([n for n in self._cache.names_with_prefix(prefix) if n.startswith(prefix)])

    def flush_all(self) -> int:
        total = 0
        while names := self._cache.dirty_before(float("inf"), 256):
            total += self.flush(names)
        return total

    def _evict_locked(self, name: str) -> bool:
        """Drop a supercuboid from the cache, flushing it first if dirty (True when it was
        written back); caller holds its write lock."""
        written_back = self._cache.is_dirty([name])[0] and self._flush_locked(name)
        self._cache.evict(name)
        return written_back

    def evict(self, name: str, lock_timeout_s: float) -> bool:
        """Drop one supercuboid from the cache (written back first if dirty) unless its lock is
        busy for longer than `lock_timeout_s` (LockTimeout). False when it was not resident."""
        with self._ledger_kept() as written_back, self._locks.write([name], timeout_s=lock_timeout_s):
            if not self._cache.resident([name])[0]:
                return False
            written_back.append(self._evict_locked(name))
            return True

    def coldest(self, count: int) -> list[str]:
        """The least recently used resident supercuboids."""
        return self._cache.coldest(count)

    def memory_used(self) -> int:
        return self._cache.used_memory()

    def occupancy(self) -> tuple[int, int]:
        """(resident, dirty) supercuboids."""
        return self._cache.count()

    def write_back_lag(self) -> float:
        """Seconds the longest-dirty supercuboid has waited to be written back (0: none waits)."""
        oldest = self._cache.oldest_dirty()
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def purge(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel: cached copies (dirty ones too, unflushed), then every
        stored supercuboid. Returns the number of stored supercuboids deleted."""
        for name in self._cache.names_with_prefix(channel.name_prefix):
            with self._locks.write([name]):
                self._cache.evict(name)
        self.accept_loss([n for n in self._cache.lost() if n.startswith(channel.name_prefix)])
        return self._base.purge(channel)

    # -- loss: the checked mark, the ledger, lost supercuboids (ndstore/engine/ledger.py) ----------
    def guard(self, names: Sequence[str]) -> str:
        """Raise DataLost when one of ``names`` is marked lost. A Redis without its checked mark
        (it restarted empty, or is another one) is checked against its ledger first. Returns the
        mark (the run), "" when there still is none: what the caller's page-ins are stored under.
        When one of ``names`` has an NDBlaze write recorded, the buffer is checked to be the run
        the record describes first (`watch_buffer`: what it lost is then marked lost)."""
        run, lost, buffered = self._cache.loss_marks(names)
        if run is None:
            self.verify()
            run, lost, buffered = self._cache.loss_marks(names)
        if buffered is not None and self._buffer_check is not None and self._buffer_check(buffered):
            run, lost, _ = self._cache.loss_marks(names)
        if lost:
            raise DataLost(lost_message(lost), sorted(lost))
        return run or ""

    def verify(self) -> Verdict | None:
        """Check the cache Redis against its ledger (ndstore/engine/ledger.py); None: nothing lost."""
        return self.ledger.verify()

    def keep_ledger(self, final: bool = False) -> None:
        """The flusher's round (and its stop, `final`): the ledger up to date."""
        self.ledger.keep(final)

    def _drop_all_but(self, keep: frozenset[str]) -> None:
        """The cache Redis lost writes: what it holds that is not intact goes, and so does the
        record of NDBlaze writes (it may be as short): rebuilt from the buffer when next checked."""
        self._cache.drop_buffered()
        for name in self._cache.names_with_prefix(""):
            if name not in keep:
                with self._locks.write([name]):
                    self._cache.evict(name)

    # -- the record of NDBlaze writes (ndstore/engine/ledger.py, "the record") ---------------------
    def watch_buffer(self, check: Callable[[str], bool]) -> None:
        """``check(run)``: make sure the NDBlaze buffer is the run the record describes ("": there
        is no record), checking it against its record otherwise (then True: what it lost is
        marked lost now); `guard` calls it for requests that touch a supercuboid with an NDBlaze
        write recorded."""
        self._buffer_check = check

    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool:
        """Record NDBlaze writes (supercuboid -> seq) before they are acknowledged; False when the
        record does not describe ``run``, the buffer's run that took them (nothing recorded)."""
        return self._cache.record_buffered(run, seqs)

    def forget_buffered(self, seqs: Mapping[str, int]) -> None:
        """Merged into the base tier up to these seqs (before the buffer releases them)."""
        self._cache.forget_buffered(seqs)

    def buffered_record(self) -> tuple[str | None, dict[str, int]]:
        return self._cache.buffered()

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        self._cache.sync_buffered(run, seq, held)

    def ledger_lock(self, what: str) -> Callable[[], AbstractContextManager[None]]:
        """The lock a ledger is kept under (no supercuboid name has a letter in it)."""
        return partial(self._locks.write, [f"ledger&{what}"])

    @property
    def objects(self) -> ObjectStore:
        """The base tier's object store (where the ledgers are kept)."""
        return self._base.objects

    def _mark_lost(self, reasons: dict[str, str]) -> None:
        self._cache.mark_lost(reasons)
        log.error("lost: %s", "; ".join(f"{n}: {why}" for n, why in reasons.items()))
        self._observer.count("losses_total", len(reasons), redis="cache")

    def mark_lost(self, reasons: dict[str, str]) -> None:
        """Refuse these supercuboids until an operator accepts their loss (the NDBlaze buffer
        lost writes to them); recorded in the ledger at once."""
        self._cache.mark_lost(reasons)
        self.ledger.record_refused()

    def lost(self) -> dict[str, str]:
        """Every supercuboid refused as lost, with why."""
        return self._cache.lost()

    def accept_loss(self, names: Sequence[str]) -> None:
        """Serve these supercuboids again, as the base tier (and the cache) now hold them."""
        if not names:
            return
        self._cache.forget_lost(names)
        self.ledger.record_refused()

    def _completed(self, name: str, dtype: np.dtype, grid: Grid, numbers: Sequence[int],
                   found: Sequence[Blob | None], run: str | None = None) -> list[Blob | None]:
        """``found`` (the blobs of cuboids ``numbers``), with any the cache forgot restored."""
        if all(b is not None for b in found):
            return list(found)
        restored = self._restore(name, dtype, grid, self._lacking(name, grid, numbers, found), run)
        return [restored[n] if b is None else b for n, b in zip(numbers, found)]

    def _lacking(self, name: str, grid: Grid, numbers: Sequence[int], found: Sequence[Blob | None]) -> list[int]:
        """What a restore of a resident supercuboid fetches: the cuboids it lacks now, and those
        ``found`` lacked (the blobs of ``numbers``) whatever happened since. Under a read lock
        another restore may store them between the two looks; the caller still needs them."""
        return sorted({*self._absent(name, grid), *(n for n, b in zip(numbers, found) if b is None)})

    def _restore(self, name: str, dtype: np.dtype, grid: Grid, lacking: Sequence[int],
                 run: str | None = None) -> dict[int, bytes]:
        """Cuboids ``lacking`` of a resident supercuboid (`_lacking`), read from the base tier and
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
            run = self._cache.loss_marks([])[0] or ""
        _, blobs = next(self._fetched([SupercuboidKey.from_name(name)], dtype, grid))
        restored = {n: bytes(blobs[n]) for n in lacking}
        self._fill(name, restored, run)
        return restored

    def _absent(self, name: str, grid: Grid) -> list[int]:
        """The cuboids a resident supercuboid lacks now (see `_lacking`)."""
        return self._cache.absent(name, range(grid.cuboid_count))

    def _fill(self, name: str, restored: Mapping[int, Blob], run: str) -> None:
        """Store a restore's cuboids (its last step, before the answer or after it), counted and logged."""
        self._cache.fill(name, restored, run)
        self._observer.count("cache_restores_total", len(restored))
        log.info("restored %d clean cuboids of %s from the base tier", len(restored), name)

    def _repair(self, damage: DamagedInCache) -> None:
        """A cached copy failed its checksum: a clean one is dropped (the base tier has it), a
        dirty one is lost."""
        name = damage.name
        with self._locks.write([name]):
            if self._cache.is_dirty([name])[0]:
                self._mark_lost({name: f"{damage} (found {time.strftime('%Y-%m-%d %H:%M:%S')})"})
            self._cache.evict(name)
        self._observer.count("cache_repairs_total", outcome="lost" if self._cache.lost().get(name) else "paged again")
        self.guard([name])


def _nbytes(blobs: Mapping[str, Mapping[int, bytes]]) -> int:
    return sum(len(b) for found in blobs.values() for b in found.values())


def _cuboids_of(obj: bytes | None, dtype: np.dtype, count: int) -> Sequence[Blob]:
    """A base-tier object's cuboid blobs (views of it); all ``b""`` (known all-zero) when there is none."""
    if obj is None:
        return [b""] * count
    stored_dtype, _, _, blobs = split_supercuboid(obj)
    if stored_dtype != dtype:
        raise DataCorrupt(f"stored supercuboid has dtype {stored_dtype}, channel has {dtype}")
    return blobs


def _untouched(blobs: Sequence[Blob], touching: Sequence[Any]) -> dict[int, Blob]:
    """The blobs of the cuboids a write did not touch (``touching``: its (number, ...) items)."""
    touched = {number for number, _, _ in touching}
    return {n: b for n, b in enumerate(blobs) if n not in touched}


def _kept(blobs: Sequence[Blob], numbers: Sequence[int]) -> list[Blob]:
    """The blobs of cuboids ``numbers``: views of the fetched object when they are most of it,
    copies when they are a few, so the object is not held for them."""
    views = 2 * len(numbers) > len(blobs)
    return [blobs[n] if views else bytes(blobs[n]) for n in numbers]


class _PageIns:
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

    def __init__(self, room: int, cache: CuboidCache, observer: Observer):
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

    def store(self, name: str, blobs: Sequence[Blob], meta: bytes, now: float, run: str) -> None:
        """Page in one fetched supercuboid now, if the cache is still in ``run``."""
        self._cache.page_in(name, {META: meta, **dict(enumerate(blobs))}, now, run)

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


class _Forgotten(Exception):
    """Resident supercuboids lacking cuboids a read wanted: to restore (`CacheTier._restore`)."""

    def __init__(self, names: list[str]):
        super().__init__(", ".join(names))
        self.names = names


def lost_message(lost: dict[str, str]) -> str:
    names = sorted(lost)
    shown = "; ".join(f"{n}: {lost[n]}" for n in names[:NAMES_IN_MESSAGES])
    more = f" and {len(names) - NAMES_IN_MESSAGES} more" if len(names) > NAMES_IN_MESSAGES else ""
    return (f"{len(names)} supercuboids of this box lost writes the service had acknowledged ({shown}{more}). "
            "The service refuses them rather than answer with older data; an operator lists the loss with "
            "`ndstore recover` and accepts it with `ndstore recover --accept-loss`")
