"""The base tier: arbitrary boxes read from and written to the supercuboids of the object store,
with the supercuboid index kept in step. It owns no cache: the cache tier (ndstore/engine/cache/) keeps
it coherent with cached copies, and everything else reaches it through the cache tier.

Reads fetch the touched supercuboids in parallel and decompress only the cuboids the box
needs; a missing object reads as zeros. A read holds at most its window of supercuboids
(`read_window_bytes` of raw voxels, at least one) fetched and not yet decoded, and as many being
decoded, so a large read holds its output array plus a constant, not a second copy of the box.

Writes lock the touched supercuboids (so two writers
of one supercuboid cannot lose each other's voxels), read-modify-write the partly covered ones,
and never store an all-zero supercuboid: a write that zeroes one deletes it.

Ordering keeps the index a superset of the stored objects: on put the index entry goes first,
on delete the object goes first. A crash in between leaves a harmless extra index entry. The
label index (label_index.py) is kept the same way, around every put and delete of a supercuboid
of a label channel.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ndstore.core.chunks import decode_supercuboid_region, encode_supercuboid
from ndstore.core.errors import InvalidBody
from ndstore.core.geometry import Box, Grid
from ndstore.core.keys import SupercuboidKey
from ndstore.core.parallel import run_all
from ndstore.core.plan import PlannedPart
from ndstore.engine.index_check import stored_with_prefix
from ndstore.engine.label_index import LabelKeeper
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import ExclusiveLocks, ObjectStore, SupercuboidIndex

Array = npt.NDArray[Any]
log = logging.getLogger("ndstore.base_tier")
READ_WINDOW_BYTES = 64 << 20
PURGE_BATCH = 1000  # supercuboids deleted (and locked) at once by a purge


class ProductMarks(Protocol):
    def changed(self, keys: list[SupercuboidKey]) -> None:
        """Supercuboids were stored or deleted: what is derived from them is stale."""


class BaseTier:
    def __init__(self, objects: ObjectStore, index: SupercuboidIndex, locks: ExclusiveLocks, parallelism: int = 8,
                 read_window_bytes: int = READ_WINDOW_BYTES, labels: LabelKeeper | None = None,
                 products: ProductMarks | None = None):
        """``products``: told of every supercuboid stored or deleted (segmentation products
        derived from it go stale); None: no products kept."""
        self.products = products
        self.read_window_bytes = read_window_bytes
        self.objects = objects
        self.index = index
        self.locks = locks
        self.labels = labels  # None: no label index kept
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="base-tier")
        # Per-cuboid codec work of one supercuboid; a pool of its own, so a task of _pool that
        # waits on it can never starve it.
        self._codec = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="codec")

    def window(self, grid: Grid, dtype: np.dtype) -> int:
        """How many supercuboids of ``grid`` make the read window's raw bytes (at least one):
        what a large read or write holds at once."""
        return grid.window(self.read_window_bytes, dtype.itemsize)

    def read(self, cutout: Cutout) -> Array:
        """The cutout as a (t, z, y, x) array; regions with nothing stored are zeros."""
        plan = cutout.plan()
        out = np.empty(cutout.shape, cutout.channel.dtype)  # every voxel is written below, once
        by_key = {p.key.object_key: p for p in plan.parts}
        window = self.window(plan.grid, out.dtype)
        decodes: deque[Future[None]] = deque()
        for object_key, blob in self.objects.get_many(list(by_key), window):
            planned = by_key[object_key]
            target = out[planned.time_index][planned.part.in_box(cutout.box)]
            if blob is None:
                target[...] = 0
                continue
            while len(decodes) >= window:
                decodes.popleft().result()
            decodes.append(self._pool.submit(decode_supercuboid_region, blob, planned.part.local_region(plan.grid),
                                             target, self._codec.map))
            del blob
        for fut in decodes:
            fut.result()
        return out

    def write(self, cutout: Cutout, data: Array) -> None:
        """Store ``data`` (shape (t, z, y, x)) over the cutout's box."""
        if data.shape != cutout.shape or data.dtype != cutout.channel.dtype:
            raise InvalidBody(
                f"data {data.shape} {data.dtype} does not fit the box {cutout.shape} {cutout.channel.dtype}"
            )
        with self.locks.hold(cutout.plan().names):
            self.write_locked(cutout, data)

    def write_locked(self, cutout: Cutout, data: Array) -> None:
        """`write` for a caller that already holds the write locks of every touched supercuboid.
        A window of supercuboids is written at once: a partly covered one holds its whole array,
        its stored object and its new one, so a thin box over many supercuboids would otherwise
        hold many times its own size."""
        plan = cutout.plan()
        run_all(self._pool, lambda p: self._write_one(p, plan.grid, data[p.time_index][p.part.in_box(cutout.box)]),
                plan.parts, self.window(plan.grid, data.dtype))

    def _write_one(self, planned: PlannedPart, grid: Grid, src: Array) -> None:
        if planned.part.full:
            merged = src
        else:
            merged = self.read_supercuboid(planned.key, grid, src.dtype)
            merged[planned.part.in_supercuboid(grid)] = src
        self.store_array(planned.key, merged, grid)

    def store_array(self, key: SupercuboidKey, whole: Array, grid: Grid) -> None:
        """Encode a whole (z, y, x) supercuboid and `store` it; the caller holds its write lock."""
        self.store(key, encode_supercuboid(whole, grid.cuboid, grid.cuboids_per_super, self._codec.map), whole)

    def store(self, key: SupercuboidKey, blob: bytes | None, whole: Array | None = None) -> None:
        """Put an encoded supercuboid, or delete it when None (all zeros), index first on put and
        last on delete, the label index around both (``whole``: the array, if the caller has
        it). The caller holds the supercuboid's write lock (or a read lock that keeps writers of
        it out)."""
        with self._labelled(key, blob, whole):
            if blob is None:
                self.objects.delete_many([key.object_key])
                self.index.delete_many([key])
            else:
                self.index.put_many([key])
                self.objects.put_many({key.object_key: blob})
        if self.products is not None:
            self._stale([key])

    def _stale(self, keys: list[SupercuboidKey]) -> None:
        """The products of stored supercuboids go stale. The voxels are stored whatever happens
        here: a failure to mark is logged and counted, and a build of the channel's products
        (POST /v1/segmentation/...) recovers from it."""
        try:
            self.products.changed(keys)  # type: ignore[union-attr]
        except Exception:  # the write stands; its products lag until a build
            log.exception("marking the segmentation products of %s stale failed", [k.name for k in keys])

    def _labelled(self, key: SupercuboidKey, blob: bytes | None, whole: Array | None) -> AbstractContextManager[None]:
        return nullcontext() if self.labels is None else self.labels.storing(key, blob, whole, self._codec.map)

    def read_supercuboid(self, key: SupercuboidKey, grid: Grid, dtype: np.dtype) -> Array:
        """One whole supercuboid as a (z, y, x) array, zeros where nothing is stored."""
        shape = grid.supercuboid
        whole = Box((0, 0, 0), shape)
        out = np.zeros(whole.shape_zyx, dtype)
        for _, blob in self.objects.get_many([key.object_key]):
            if blob is not None:
                decode_supercuboid_region(blob, whole, out, self._codec.map)
        return out

    def purge(self, channel: ChannelVolume) -> int:
        """Delete every stored supercuboid of a channel, at every level and time sample it ever
        stored, whatever its experiment declares now (a lowered num_time_samples or
        num_hierarchy_levels hides data, never deletes it): first those the index lists under the
        channel's name prefix, then any the object store's listing still holds (an object whose
        index entry was lost). Returns the count."""
        prefix, count = channel.name_prefix, 0
        for volume in self.index.volumes(prefix):
            mortons = self.index.mortons(volume)
            for i in range(0, len(mortons), PURGE_BATCH):
                count += self._delete([volume.supercuboid(m) for m in mortons[i : i + PURGE_BATCH]])
        left = stored_with_prefix(self.objects, prefix)
        while batch := list(itertools.islice(left, PURGE_BATCH)):
            count += self._delete(batch)
        if self.labels is not None:
            self.labels.forget(prefix)  # and label entries of no object (a write that died before its put)
        return count

    def _delete(self, keys: list[SupercuboidKey]) -> int:
        """Delete stored supercuboids under their write locks, each object before its index entry."""
        with self.locks.hold([k.name for k in keys]), self.labels.deleting(keys) if self.labels else nullcontext():
            self.objects.delete_many([k.object_key for k in keys])
            self.index.delete_many(keys)
        return len(keys)
