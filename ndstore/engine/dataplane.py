"""The data plane's front door: every request that reads or writes voxels goes through here.

It alone decides
- which tier answers a read (`Read`) or takes a write (`Write`), so a write through any path
  shows at once in every view (DESIGN §5): a read sees the writes still pending in NDBlaze unless
  it asks for the base tier as it is;
- what a request holds in a web worker while it is served (`reserve`, ndstore/engine/cost.py);
- the reads derived from voxels (`ids`, `bounding_box`), answered from the label index where it
  can be trusted (label_index.py);
- which levels hold data (`levels`, a LevelRecord every voxel writer reaches).

NDBlaze comes in as a `Buffered` tier (the blaze package sits above the engine), so the layers
hold. A data view is: parse the request, `reserve`, one call here, render the answer.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ndstore.core import morton
from ndstore.core.errors import StorageError
from ndstore.core.geometry import Box
from ndstore.core.keys import SEPARATOR, SupercuboidKey
from ndstore.core.labels import in_range
from ndstore.core.plan import PlannedPart
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.cost import ByteBudget, Reservation, cost
from ndstore.engine.direct import CoherentDirect, RawReads
from ndstore.engine.index_check import GuardedIndex
from ndstore.engine.label_index import LabelKeeper
from ndstore.engine.levels import LevelRecord
from ndstore.engine.volume import ChannelVolume, Cutout

Array = npt.NDArray[Any]
log = logging.getLogger(__name__)


class Read(enum.Enum):
    """Which state of the volume a read returns."""

    LIVE = "cache"  # every acknowledged write: through the cache tier, plus writes pending in NDBlaze
    BASE = "no_cache"  # the same voxels, from the base tier after dirty cached data is written back
    RAW = "raw"  # the base tier as it is: no dirty cached data, no pending NDBlaze write
    BUFFERED = "blaze"  # the base tier plus every pending NDBlaze write; fails while NDBlaze cannot answer


class Write(enum.Enum):
    """Which tier takes a write."""

    CACHE = "cache"  # the cache tier: written back by the flusher (before the answer, if write-through)
    DIRECT = "direct"  # the base tier, cached copies dropped
    BUFFERED = "blaze"  # the NDBlaze buffer, as it arrived; the merger applies it


class Buffered(Protocol):
    """The NDBlaze write buffer, as the data plane sees it (blaze.tier.BlazeTier)."""

    def has_pending(self, names: Sequence[str]) -> bool: ...

    def pending_names(self, prefix: str) -> list[str]: ...

    def read(self, cutout: Cutout) -> Array:
        """The base tier plus the writes pending in the box, in order."""

    def write(self, cutout: Cutout, data: Array) -> None: ...

    def write_body(self, cutout: Cutout, body: bytes, media_type: str, has_time: bool) -> int:
        """Buffer a request body as it arrived (validated, never decoded); returns its sequence."""

    def discard(self, prefix: str) -> int:
        """Drop the pending writes of the supercuboids whose names start with ``prefix``."""


class Tier(Protocol):
    def read(self, cutout: Cutout) -> Array: ...

    def write(self, cutout: Cutout, data: Array) -> None: ...


class DataPlane:
    def __init__(self, cache: CacheTier, buffered: Buffered, index: GuardedIndex, levels: LevelRecord,
                 budget: ByteBudget, window_bytes: int, labels: LabelKeeper | None = None):
        self.labels = labels
        self.cache = cache
        self.direct = CoherentDirect(cache)
        self.raw = RawReads(cache)
        self.buffered = buffered
        self.index = index
        self.levels = levels
        self.budget = budget
        self.window_bytes = window_bytes
        self._writers: dict[Write, Tier] = {Write.CACHE: cache, Write.DIRECT: self.direct, Write.BUFFERED: buffered}

    # -- cost ---------------------------------------------------------------------------------------
    def reserve(self, array_bytes: int, cutout: Cutout | None, *, reading: bool, anonymous: bool) -> Reservation:
        """Take from this worker's budget what a read (or write) of an array of `array_bytes` over
        `cutout`'s supercuboids holds (cutout None: no supercuboids); Busy or PayloadTooLarge."""
        return self.budget.take(cost(reading, array_bytes, cutout, self.window_bytes), anonymous)

    # -- voxels -------------------------------------------------------------------------------------
    def read(self, cutout: Cutout, mode: Read = Read.LIVE) -> Array:
        """The cutout's voxels, (t, z, y, x). Where the NDBlaze Redis cannot say whether writes to
        the box are pending, the read serves the merged writes only and says so in the log: a
        viewer or a pipeline keeps working through an NDBlaze outage."""
        if mode is Read.RAW:
            return self.raw.read(cutout)
        if mode is Read.BUFFERED:  # its caller asked for the pending writes: no answer without them
            return self.buffered.read(cutout)
        if self._pending(cutout):
            return self.buffered.read(cutout)
        return (self.cache if mode is Read.LIVE else self.direct).read(cutout)

    def stored(self, cutout: Cutout) -> bytes | None:
        """The live state of a box inside one cuboid as the cuboid's stored blob (b"": all zeros),
        for views that send stored cuboids as they are; None when the cache tier cannot give it
        from a lock-free snapshot (then `read` answers). One round trip: the snapshot declines a
        supercuboid with an NDBlaze write on record, and a write is on record before it is
        acknowledged until its merge is stored (blaze/tier.py), so no second question to NDBlaze's
        Redis is needed to know none is pending."""
        return self.cache.stored(cutout)

    def _pending(self, cutout: Cutout) -> bool:
        """Whether NDBlaze writes to the box are pending: one snapshot, one Redis round trip."""
        try:
            return self.buffered.has_pending(cutout.plan().names)
        except StorageError as exc:
            log.warning("read without pending NDBlaze writes: %s", exc)
            return False

    def write(self, cutout: Cutout, data: Array, path: Write = Write.CACHE) -> None:
        """Write the cutout's voxels, (t, z, y, x), through `path`; the level is then built."""
        self._writers[path].write(cutout, data.reshape(cutout.shape))
        self.levels.note_written(cutout.channel, cutout.resolution)

    def buffer(self, cutout: Cutout, body: bytes, media_type: str, has_time: bool) -> int:
        """Buffer a write's body in NDBlaze as it arrived; returns its sequence number."""
        seq = self.buffered.write_body(cutout, body, media_type, has_time)
        self.levels.note_written(cutout.channel, cutout.resolution)
        return seq

    # -- derived reads ------------------------------------------------------------------------------
    def ids(self, cutout: Cutout) -> Array:
        """The non-zero label ids in the box, ascending. Where the channel's label index serves,
        the supercuboids the box covers (within the level's extent) answer from it, once their
        dirty cached copies are written back, unless they have NDBlaze writes pending or are
        marked unsettled; the rest of the box is read."""
        labels = self._serving(cutout.channel)
        whole = self._whole_parts(cutout) if labels is not None else []
        if labels is None or not whole:
            return _nonzero(self.read(cutout))
        self.cache.loss.guard([p.key.name for p in whole])  # a supercuboid marked lost answers 503, as a read
        self.cache.flush([p.key.name for p in whole])  # cached writes reach the base tier and its index
        # the entries first, then which supercuboids are doubtful: one whose write began while
        # its entries were read is marked by then, and read instead
        held = labels.labels_of(list({p.key: None for p in whole}))
        doubtful = self._doubtful(cutout, labels)
        indexed = {p for p in whole if p.key.name not in doubtful}
        found = [np.fromiter((label for p in indexed for label in held[p.key]), np.uint64)]
        for p in cutout.plan().parts:
            if p not in indexed:
                t = cutout.times[p.time_index]
                found.append(_nonzero(self.read(Cutout(cutout.channel, cutout.resolution, p.part.region,
                                                       range(t, t + 1)))).astype(np.uint64))
        ids: Array = np.unique(np.concatenate(found)).astype(cutout.channel.dtype)
        return ids

    def _serving(self, channel: ChannelVolume) -> LabelKeeper | None:
        """The label index, when it serves the channel (registered and complete)."""
        return self.labels if self.labels is not None and self.labels.serves(channel.name_prefix) else None

    def _whole_parts(self, cutout: Cutout) -> list[PlannedPart]:
        """The parts that cover their supercuboid within the level's extent (nothing is ever
        written outside it)."""
        grid, extent = cutout.channel.grid(cutout.resolution), cutout.channel.extent(cutout.resolution)
        return [p for p in cutout.plan().parts
                if p.part.full or grid.supercuboid_box(p.part.index).intersect(extent) == p.part.region]

    def _doubtful(self, cutout: Cutout, labels: LabelKeeper) -> set[str]:
        """Names of the cutout's volumes' supercuboids whose index entries are not the voxels a
        read sees: NDBlaze writes pending, or marked unsettled."""
        volumes = [cutout.channel.volume_key(cutout.resolution, t) for t in cutout.times]
        doubtful = {v.supercuboid(m).name for v in volumes for m in labels.unsettled(v)}
        level = f"{cutout.channel.name_prefix}{cutout.resolution}{SEPARATOR}"
        try:
            doubtful.update(self.buffered.pending_names(level))
        except StorageError as exc:
            log.warning("ids without pending NDBlaze writes: %s", exc)
        return doubtful

    def bounding_box(self, channel: ChannelVolume, resolution: int, label: int,
                     loose: bool) -> dict[str, list[int]] | None:
        """Where `label` occurs at `resolution`, over all time samples, as a Boss bounding box;
        `loose` widens it to cuboid boundaries (clipped to the level's extent). None if it occurs
        nowhere. Reads the supercuboids of the level that the channel's label index lists for the
        label or marks unsettled (without a label index serving: every stored one), and those
        with pending NDBlaze writes; dirty cached ones are written back first, so the indexes
        list them."""
        if not in_range(label, channel.dtype):
            return None
        self.cache.write_back(f"{channel.name_prefix}{resolution}{SEPARATOR}")
        grid, extent = channel.grid(resolution), channel.extent(resolution)
        lo: list[int] = []
        hi: list[int] = []
        times: list[int] = []
        for t, box in self._boxes_holding(channel, resolution, label):
            found = _span(self.read(Cutout(channel, resolution, box, range(t, t + 1)), Read.BASE)[0] == label, box)
            if found is None:
                continue
            lo = [min(a, b) for a, b in zip(lo or found[0], found[0])]
            hi = [max(a, b) for a, b in zip(hi or found[1], found[1])]
            times.append(t)
        if not times:
            return None
        if loose:
            lo = [max(e, v // c * c) for v, c, e in zip(lo, grid.cuboid, extent.lo)]
            hi = [min(e, -(-v // c) * c) for v, c, e in zip(hi, grid.cuboid, extent.hi)]
        return {"x_range": [lo[0], hi[0]], "y_range": [lo[1], hi[1]], "z_range": [lo[2], hi[2]],
                "t_range": [min(times), max(times) + 1]}

    def _boxes_holding(self, channel: ChannelVolume, resolution: int, label: int) -> list[tuple[int, Box]]:
        """(time, box within the level's extent) of each supercuboid that may hold `label`, in
        time and Morton order: those the label index names (else every stored one) and those
        with pending NDBlaze writes."""
        labels = self._serving(channel)
        grid, extent = channel.grid(resolution), channel.extent(resolution)
        codes: set[tuple[int, int]] = set()
        for t in range(channel.num_time_samples):
            volume = channel.volume_key(resolution, t)
            listed = self.index.mortons(volume) if labels is None else labels.holding(volume, label)
            codes.update((t, code) for code in listed)
        for name in self.buffered.pending_names(channel.name_prefix):
            key = SupercuboidKey.from_name(name)
            if key.volume.resolution == resolution:
                codes.add((key.volume.time, key.morton))
        boxes = []
        for t, code in sorted(codes):
            box = grid.supercuboid_box(morton.decode_one(code)).intersect(extent)
            if box is not None:
                boxes.append((t, box))
        return boxes

    # -- operations ---------------------------------------------------------------------------------
    def purge(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel: its pending NDBlaze writes first (so no merge can bring
        them back), then cached and stored supercuboids, then its level marks. Returns the stored
        supercuboids deleted. Refused before anything is deleted while the index is stale (it finds
        what to delete)."""
        self.index.require_fresh()
        self.buffered.discard(channel.name_prefix)
        deleted = self.cache.purge(channel)
        self.levels.forget(channel)
        return deleted


def _nonzero(data: Array) -> Array:
    """The distinct non-zero values, ascending."""
    ids = np.unique(data.reshape(-1))
    nonzero: Array = ids[ids != 0]
    return nonzero


def _span(mask: npt.NDArray[np.bool_], origin: Box) -> tuple[list[int], list[int]] | None:
    """(lo, hi) in (x, y, z) of the True voxels of a (z, y, x) mask placed at origin.lo."""
    if not mask.any():
        return None
    lo, hi = [], []
    for axis in (2, 1, 0):  # x, y, z
        hits = np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != axis)))
        lo.append(int(hits[0]) + origin.lo[2 - axis])
        hi.append(int(hits[-1]) + 1 + origin.lo[2 - axis])
    return lo, hi
