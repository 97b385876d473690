"""Merging pending blobs into the base tier, one supercuboid at a time.

Under the supercuboid's write lock: snapshot its pending seqs, drop any cached copy (written
back first when dirty, so the cache can never serve a stale one), read the stored supercuboid,
apply the blobs in sequence order, store the result, drop the supercuboid from the record of
NDBlaze writes up to those seqs (ndstore/engine/ledger.py), and only then release exactly them.
A crash before the release leaves the blobs pending; the next merge applies them again over a
base that already holds them, which changes nothing, because a blob overwrites its voxels and
applying the same sequence of overwrites twice gives the same result. A blob that arrives
during a merge gets a later seq than the snapshot and stays for the next round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from blaze.blob import BlobHeader, apply_to
from ndstore.core import morton
from ndstore.core.errors import DataCorrupt, DataLost
from ndstore.core.keys import SupercuboidKey
from ndstore.engine.cache.ports import BufferRecord, Coherence, Rewrite
from ndstore.engine.cache.tier import CacheTier
from ndstore.storage.interfaces import BlazeBuffer, PendingBlob

Array = npt.NDArray[Any]
log = logging.getLogger(__name__)


@dataclass
class MergeResult:
    supercuboids: int = 0
    blobs_applied: int = 0
    supercuboids_failed: int = 0  # left pending: a blob no longer decodes (DataCorrupt, logged)
    voxel_bytes: int = 0  # raw bytes of the supercuboids rewritten
    seconds: float = 0.0

    def __add__(self, other: MergeResult) -> MergeResult:
        return MergeResult(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class DecodedBlobs:
    """Decoded blob arrays by seq, kept while they fit in ``max_bytes``: a blob touching
    several supercuboids of one merge partition is decoded once. Blobs never change."""

    def __init__(self, max_bytes: int = 512 << 20):
        self.max_bytes = max_bytes
        self._arrays: OrderedDict[int, Array] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, blob: PendingBlob, header: BlobHeader) -> Array:
        with self._lock:
            if blob.seq in self._arrays:
                self._arrays.move_to_end(blob.seq)
                return self._arrays[blob.seq]
        array = header.decode_stored(blob.seq, blob.body)
        with self._lock:
            self._arrays[blob.seq] = array
            self._bytes += array.nbytes
            while self._bytes > self.max_bytes and len(self._arrays) > 1:
                self._bytes -= self._arrays.popitem(last=False)[1].nbytes
        return array


class Merger:
    def __init__(self, buffer: BlazeBuffer, cache_tier: CacheTier):
        """Rewrites supercuboids coherently with the cache (its Coherence port) and drops what it
        merged from the record of NDBlaze writes (`CacheTier.loss`, its BufferRecord port)."""
        self.buffer = buffer
        self.tier: Coherence = cache_tier
        self.record: BufferRecord = cache_tier.loss
        self.decoded = DecodedBlobs()

    def merge(self, names: Iterable[str]) -> MergeResult:
        total = MergeResult()
        for name in names:
            try:
                total = total + self.merge_one(name)
            except (DataCorrupt, DataLost) as exc:  # its blobs stay pending; the other supercuboids merge
                log.error("supercuboid %s not merged: %s", name, exc)
                total = total + MergeResult(supercuboids_failed=1)
        return total

    def merge_one(self, name: str) -> MergeResult:
        started = time.perf_counter()
        key = SupercuboidKey.from_name(name)
        with self.tier.rewriting(key) as supercuboid:
            seqs = self.buffer.pending_seqs([name])[name]
            if not seqs:
                return MergeResult()
            result = self._apply(supercuboid, self.buffer.blobs(seqs))
            self.record.forget_buffered({name: seqs[-1]})  # stored: no longer theirs to lose
            self.buffer.release(name, seqs)
        result.seconds = time.perf_counter() - started
        return result

    def _apply(self, supercuboid: Rewrite, blobs: list[PendingBlob]) -> MergeResult:
        decoded = [(header, self.decoded.get(blob, header))
                   for blob, header in ((b, BlobHeader.from_json(b.header)) for b in blobs)]
        if not decoded:
            return MergeResult()
        key, (grid, dtype) = supercuboid.key, (decoded[0][0].grid, decoded[0][0].dtype)
        whole = supercuboid.read(grid, dtype)
        box = grid.supercuboid_box(morton.decode_one(key.morton))
        times = range(key.volume.time, key.volume.time + 1)
        for header, data in decoded:
            apply_to(whole[np.newaxis], box, times, header, data)
        supercuboid.store(whole, grid)
        return MergeResult(1, len(decoded), 0, whole.nbytes)
