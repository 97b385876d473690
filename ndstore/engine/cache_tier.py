"""The cache tier: reads and writes through Redis, written back to the base tier.

Read: plan the box into supercuboids; take read locks on the resident ones and write locks on
the missing ones, together (one consistent snapshot); page in what is still missing (re-checked
under its write lock, so concurrent misses of one supercuboid fetch it once) and use those blobs
directly; fetch just the cuboids the box touches of the others; release, update access times
and assemble.
Write: under write locks, page in what is missing, merge partly covered cuboids, store the new
cuboid blobs and mark the supercuboids dirty; the flusher writes them back (or, for a
write-through channel, the write does before it returns).
See docs/design/cache-tier.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

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
from ndstore.core.errors import InvalidBody, StorageError
from ndstore.core.geometry import Grid, SupercuboidPart
from ndstore.core.keys import SupercuboidKey
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import CuboidCache, RWLocks
from ndstore.storage.parallel import map_ordered, run_all

Array = npt.NDArray[Any]
META = -1  # cache field holding "dtype cuboid-shape counts", so the flusher needs no metadata DB


def _meta(dtype: np.dtype, grid: Grid) -> bytes:
    return " ".join([dtype.str, *map(str, grid.cuboid), *map(str, grid.cuboids_per_super)]).encode()


def _parse_meta(raw: bytes) -> tuple[np.dtype, Grid]:
    dtype, *dims = raw.decode().split()
    v = [int(d) for d in dims]
    return np.dtype(dtype), Grid((v[0], v[1], v[2]), (v[3], v[4], v[5]))


class CacheTier:
    def __init__(self, cache: CuboidCache, base: BaseTier, locks: RWLocks, parallelism: int = 8,
                 clock: Callable[[], float] = time.time):
        self.cache = cache
        self.base = base
        self.locks = locks
        self.clock = clock
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="cache-tier")
        # Per-cuboid codec work of one supercuboid (blosc releases the GIL: see core.chunks).
        self._codec = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="cache-codec")

    # -- reads -------------------------------------------------------------------------------
    def read(self, cutout: Cutout) -> Array:
        grid, jobs = self.base.plan(cutout)
        keys = list({key.name: key for key, _, _ in jobs}.values())
        names = [k.name for k in keys]
        wanted = {key.name: [n for n, _, _ in self._touching(part, grid)] for key, _, part in jobs}
        blobs = None
        for attempt in range(5):
            # the last try takes write locks on them all: eviction needs those too, so cannot win again
            blobs = self._read_blobs(keys, wanted, cutout.channel.dtype, grid, exclusive=attempt == 4)
            if blobs is not None:
                break
        if blobs is None:
            raise StorageError("the cache evicted this box's supercuboids faster than it could read them; try again")
        self.cache.touch(names, self.clock())
        out = np.empty(cutout.shape, cutout.channel.dtype)
        run_all(self._pool, lambda job: self._decode(job, blobs[job[0].name], wanted[job[0].name], grid, out,
                                                     cutout), jobs)
        return out

    def _read_blobs(self, keys: list[SupercuboidKey], wanted: dict[str, list[int]], dtype: np.dtype,
                    grid: Grid, exclusive: bool = False) -> dict[str, list[bytes | None]] | None:
        """One consistent snapshot of the wanted cuboids: read locks on the resident
        supercuboids and write locks on the missing ones (on all of them if `exclusive`), all
        held together; the missing ones are paged in (each fetched once, whoever gets its write
        lock first) and their blobs used straight away. None when a supercuboid was evicted
        before its read lock was taken."""
        names = [k.name for k in keys]
        was_resident = dict(zip(names, [False] * len(names) if exclusive else self.cache.resident(names)))
        missing = [k for k in keys if not was_resident[k.name]]
        with self.locks.mixed(reads=[n for n in names if was_resident[n]], writes=[k.name for k in missing]):
            resident = dict(zip(names, self.cache.resident(names)))
            if any(was_resident[n] and not resident[n] for n in names):
                return None
            fetched = self._fetch([k for k in missing if not resident[k.name]], dtype, grid)
            blobs = self.cache.get_many({n: wanted[n] for n in names if n not in fetched})
        for name, all_blobs in fetched.items():
            blobs[name] = [all_blobs[i] for i in wanted[name]]
        return blobs

    @staticmethod
    def _touching(part: SupercuboidPart, grid: Grid) -> list[Any]:
        return cuboids_touching(part.local_region(grid), grid.cuboid, grid.cuboids_per_super)

    def _decode(self, job: Any, blobs: list[bytes | None], numbers: list[int], grid: Grid, out: Array,
                cutout: Cutout) -> None:
        key, ti, part = job
        if any(b is None for b in blobs):
            raise StorageError(f"cuboids of supercuboid {key.name} vanished from the cache; try again")
        decode_blobs_region(dict(zip(numbers, blobs)), grid.cuboid, grid.cuboids_per_super,  # type: ignore[arg-type]
                            part.local_region(grid), out[ti][part.in_box(cutout.box)],
                            partial(map_ordered, self._codec))

    def _fetch(self, keys: Sequence[SupercuboidKey], dtype: np.dtype, grid: Grid) -> dict[str, list[bytes]]:
        """Copy supercuboids from the base tier into the cache; return their cuboid blobs."""
        if not keys:
            return {}
        by_object = {k.object_key: k for k in keys}
        count = int(np.prod(grid.cuboids_per_super))
        now = self.clock()
        fetched: dict[str, list[bytes]] = {}
        for object_key, obj in self.base.objects.get_many(list(by_object)):
            if obj is None:
                blobs = [b""] * count  # known all-zero: no further base-tier access for it
            else:
                stored_dtype, _, _, blobs = split_supercuboid(obj)
                if stored_dtype != dtype:
                    raise InvalidBody(f"stored supercuboid has dtype {stored_dtype}, channel has {dtype}")
            name = by_object[object_key].name
            self.cache.put(name, {META: _meta(dtype, grid), **dict(enumerate(blobs))}, now, dirty=False)
            fetched[name] = blobs
        return fetched

    # -- writes ------------------------------------------------------------------------------
    def write(self, cutout: Cutout, data: Array) -> None:
        if data.shape != cutout.shape or data.dtype != cutout.channel.dtype:
            raise InvalidBody(f"data {data.shape} {data.dtype} does not fit the box {cutout.shape}")
        grid, jobs = self.base.plan(cutout)
        keys = list({key.name: key for key, _, _ in jobs}.values())
        touching = {key.name: self._touching(part, grid) for key, _, part in jobs}
        partly = {name: [n for n, cbox, sub in items if sub != cbox] for name, items in touching.items()}
        with self.locks.write([k.name for k in keys]):
            # whether each supercuboid is resident and its partly covered cuboids, in one round
            # trip; one that is not resident is paged in whole first
            old = self.cache.get_if_resident(partly)
            paged = self._fetch([k for k in keys if old[k.name] is None], cutout.channel.dtype, grid)
            for name, blobs in paged.items():
                old[name] = [blobs[n] for n in partly[name]]
            run_all(self._pool, lambda job: self._merge(job, grid, data[job[1]][job[2].in_box(cutout.box)],
                                                        touching[job[0].name],
                                                        dict(zip(partly[job[0].name], old[job[0].name] or []))),
                    jobs)
            if cutout.channel.write_through:
                for key in keys:
                    self.flush_locked(key.name)

    def _merge(self, job: Any, grid: Grid, src: Array, touching: list[Any], old: dict[int, bytes | None]) -> None:
        key, _, part = job
        shape = (grid.cuboid[2], grid.cuboid[1], grid.cuboid[0])
        local = part.local_region(grid)

        def merged(item: tuple[int, Any, Any]) -> tuple[int, bytes]:
            n, cbox, sub = item
            piece = src[sub.slices_zyx(local.lo)]
            if sub == cbox:
                return n, compress_cuboid(piece)
            cuboid = decompress_cuboid(old[n] or b"", src.dtype, shape).copy()
            cuboid[sub.slices_zyx(cbox.lo)] = piece
            return n, compress_cuboid(cuboid)

        new = dict(map_ordered(self._codec, merged, touching))
        self.cache.put(key.name, {META: _meta(src.dtype, grid), **new}, self.clock(), dirty=True)

    # -- write-back --------------------------------------------------------------------------
    def flush_locked(self, name: str) -> None:
        """Write one resident supercuboid back to the base tier and mark it clean. The caller
        holds its read or write lock, so no write can slip in between."""
        meta = self.cache.get_many({name: [META]})[name][0]
        if meta is None:
            self.cache.clear_dirty(name)  # evicted after flushing elsewhere; nothing to write
            return
        dtype, grid = _parse_meta(meta)
        count = int(np.prod(grid.cuboids_per_super))
        blobs = self.cache.get_all(name, count)
        if any(b is None for b in blobs):
            raise StorageError(f"supercuboid {name} is only partly in the cache; not flushed")
        self.base.store(SupercuboidKey.from_name(name),
                        join_supercuboid([b or b"" for b in blobs], dtype, grid.cuboid, grid.cuboids_per_super))
        self.cache.clear_dirty(name)

    def flush(self, names: Sequence[str]) -> int:
        """Flush the named supercuboids that are still dirty, each under its read lock."""
        def one(name: str) -> int:
            with self.locks.read([name]):
                if self.cache.is_dirty([name])[0]:
                    self.flush_locked(name)
                    return 1
            return 0
        return sum(self._pool.map(one, names))

    def flush_older_than(self, age_s: float, limit: int) -> int:
        return self.flush(self.cache.dirty_before(self.clock() - age_s, limit))

    def flush_all(self) -> int:
        total = 0
        while names := self.cache.dirty_before(float("inf"), 256):
            total += self.flush(names)
        return total

    # -- eviction and coherence --------------------------------------------------------------
    def evict_locked(self, name: str) -> None:
        """Drop a supercuboid from the cache, flushing it first if dirty; caller holds its write lock."""
        if self.cache.is_dirty([name])[0]:
            self.flush_locked(name)
        self.cache.evict(name)

    def purge(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel: cached copies (dirty ones too, unflushed), then every
        stored supercuboid. Returns the number of stored supercuboids deleted."""
        for name in self.cache.names_with_prefix(channel.name_prefix):
            with self.locks.write([name]):
                self.cache.evict(name)
        return self.base.purge(channel)
