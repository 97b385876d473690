"""The stored fragments of a label channel: one object per (kind, supercuboid), holding every
label's piece of that supercuboid (a mesh: its levels of detail; a skeleton: its part), written
by the rebuild of that supercuboid and read by the product views.

A supercuboid's fragment is built from its voxels and a one-voxel overlap into its high-side
neighbours (so neighbouring meshes meet without cracks): a label stored in supercuboid S may
therefore have pieces in S and in each of S's seven low-side neighbours. `holding` names them.

Fragment objects live in the base tier's object store, under a name that is not a supercuboid
key (`_ndstore-seg&<kind>&<supercuboid name>`): reindexing and channel listings pass over them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ndstore.core import morton
from ndstore.core.errors import LabelIndexNotServing
from ndstore.core.keys import SEPARATOR, SupercuboidKey, VolumeKey
from ndstore.engine.label_index import LabelKeeper
from ndstore.storage.interfaces import ObjectStore

PREFIX = "_ndstore-seg&"
KINDS = ("mesh", "skeleton")
LABELS_TTL_S = 2.0
CACHED_LABELS = 100_000
LOW_SIDE = [(dx, dy, dz) for dz in (0, 1) for dy in (0, 1) for dx in (0, 1)]


def object_key(kind: str, key: SupercuboidKey) -> str:
    if kind not in KINDS:
        raise ValueError(f"no fragment kind {kind!r}; kinds are {', '.join(KINDS)}")
    return f"{PREFIX}{kind}{SEPARATOR}{key.name}"


def low_side(codes: Iterable[int]) -> set[int]:
    """The Morton codes of the supercuboids and of each one's low-side neighbours (whose
    fragments reach one voxel into it)."""
    out: set[int] = set()
    for code in codes:
        x, y, z = morton.decode_one(code)
        out.update(morton.encode_one(x - dx, y - dy, z - dz) for dx, dy, dz in LOW_SIDE
                   if x >= dx and y >= dy and z >= dz)
    return out


class Fragments:
    def __init__(self, objects: ObjectStore, labels: LabelKeeper | None, labels_ttl_s: float = LABELS_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.objects = objects
        self.labels = labels
        self.labels_ttl_s = labels_ttl_s
        self._clock = clock
        self._listed: dict[VolumeKey, tuple[float, Mapping[int, int]]] = {}
        self._guard = threading.Lock()

    def put(self, kind: str, key: SupercuboidKey, blob: bytes) -> None:
        self.objects.put_many({object_key(kind, key): blob})

    def delete(self, kind: str, keys: Sequence[SupercuboidKey]) -> None:
        self.objects.delete_many([object_key(kind, k) for k in keys])

    def get_many(self, kind: str, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, bytes]:
        """The stored fragment objects of these supercuboids (those never built are absent)."""
        by_object = {object_key(kind, k): k for k in keys}
        return {by_object[name]: blob for name, blob in self.objects.get_many(list(by_object)) if blob is not None}

    def holding(self, volume: VolumeKey, label: int) -> list[SupercuboidKey]:
        """Every supercuboid whose fragment may hold a piece of ``label``: those the label index
        lists with it (and its unsettled ones) and their low-side neighbours. 503 while the
        index does not serve the channel."""
        if self.labels is None or not self.labels.serves(volume.channel_prefix):
            raise LabelIndexNotServing("the label index does not serve this channel yet: segmentation products need it "
                                     "(an operator runs `ndstore reindex --labels`)")
        return [volume.supercuboid(code) for code in sorted(low_side(self.labels.holding(volume, label)))]

    def of_label(self, kind: str, volume: VolumeKey, label: int) -> dict[SupercuboidKey, bytes]:
        """The stored fragment objects that may hold a piece of ``label``."""
        return self.get_many(kind, self.holding(volume, label))

    def labels_in(self, volume: VolumeKey) -> Mapping[int, int]:
        """label -> voxels of every label the index lists in the volume (0 excluded). A reader
        of a shard asks three times in a row (its index, minishard index, then the bytes): a
        listing is kept `labels_ttl_s` (products lag their writes by more than that anyway),
        where it holds at most CACHED_LABELS labels."""
        with self._guard:
            until, listed = self._listed.get(volume, (0.0, {}))
        if self._clock() < until:
            return listed
        listed = self._list(volume)
        if len(listed) <= CACHED_LABELS:
            with self._guard:
                self._listed = {v: e for v, e in self._listed.items() if e[0] > self._clock()}
                self._listed[volume] = (self._clock() + self.labels_ttl_s, listed)
        return listed

    def _list(self, volume: VolumeKey) -> Mapping[int, int]:
        if self.labels is None or not self.labels.serves(volume.channel_prefix):
            raise LabelIndexNotServing("the label index does not serve this channel yet: segmentation products need it "
                                     "(an operator runs `ndstore reindex --labels`)")
        totals: dict[int, int] = {}
        keys = [k for k in self.labels.index.indexed(volume.channel_prefix) if k.volume == volume]
        for counts in self.labels.labels_of(keys).values():
            for label, voxels in counts.items():
                if label:
                    totals[label] = totals.get(label, 0) + voxels
        return totals
