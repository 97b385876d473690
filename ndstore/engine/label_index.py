"""The label index kept in step with the base tier, read by the data plane, rebuilt from the
object store (docs/design/label-index.md).

Every supercuboid reaches the base tier through `BaseTier.store` (cache write-back, direct
writes, NDBlaze merges, ingest, downsampling) or leaves it through `BaseTier._delete` (a channel
purge); both wrap their object writes in `LabelKeeper.replacing`, under the supercuboid's write
lock:

1. its labels are counted (fastremap) from the array, or decoded from the object;
2. `begin`: the supercuboid is marked unsettled, then the labels it gains and the new counts are
   written (its old entries stay);
3. the object is put or deleted;
4. `settle`: the labels it lost are removed, then the mark.

A crash (or a failed put) between leaves the mark and a superset of entries: readers read the
voxels of a marked supercuboid instead of trusting its entries, and the next store of it, or
`ndstore reindex --labels`, settles it. A supercuboid of more than `max_labels` labels is
recorded as marked only ("dense"): its writes stay bounded, its reads go to the voxels.

Only the channels registered in the index are kept (label channels: registered when created,
or by `ndstore_prepare` and `ndstore reindex --labels` for older ones). A process remembers a
registered channel for good, and an unregistered one for `unknown_ttl_s`: a rebuild of a channel
that was not complete waits that long before it counts, so that no process still skips it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from ndstore.core.chunks import Mapper, decode_supercuboid
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.core.labels import label_counts
from ndstore.engine.index_check import stored_supercuboids
from ndstore.storage.interfaces import ExclusiveLocks, LabelIndex, ObjectStore

Array = npt.NDArray[Any]
Counts = dict[int, int]
MAX_LABELS = 1 << 14  # labels recorded per supercuboid: 2 x 16384 DynamoDB items at most, then "dense"
UNKNOWN_TTL_S = 30.0
WRITING = "writing"
REBUILD_BATCH = 64  # supercuboids locked, fetched and counted at once by a rebuild


class LabelKeeper:
    def __init__(self, index: LabelIndex, max_labels: int = MAX_LABELS, unknown_ttl_s: float = UNKNOWN_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.index = index
        self.max_labels = max_labels
        self.unknown_ttl_s = unknown_ttl_s
        self._clock = clock
        self._known: dict[str, float] = {}  # channel prefix -> until when its answer holds (inf: registered)

    # -- which channels ---------------------------------------------------------------------------
    def keeps(self, volume: VolumeKey) -> bool:
        """Whether the volume's channel is registered (its stores are indexed)."""
        prefix, now = volume.channel_prefix, self._clock()
        until = self._known.get(prefix)
        if until is None or (until != float("inf") and now >= until):
            registered = self.index.channel(prefix) is not None
            until = float("inf") if registered else now + self.unknown_ttl_s
            self._known[prefix] = until
        return until == float("inf")

    def serves(self, channel_prefix: str) -> bool:
        """Whether the data plane may answer from the channel's index: registered and complete.
        Asked of the index each time (a rebuild completes it; a damaged SQLite file set aside
        empties it)."""
        return self.index.channel(channel_prefix) is True

    def register(self, prefixes: Sequence[str], complete: bool) -> list[str]:
        """Register channels (label channels) not registered yet; returns those newly registered."""
        return self.index.register(prefixes, complete)

    # -- writes: around the base tier's -----------------------------------------------------------
    def storing(self, key: SupercuboidKey, blob: bytes | None, whole: Array | None,
                mapper: Mapper[Any, None] = map) -> AbstractContextManager[None]:
        """Around the put (or, with ``blob`` None, the delete) of one supercuboid; ``whole``: its
        array when the caller has it (no decode)."""
        if not self.keeps(key.volume):
            return nullcontext()
        if blob is None:
            return self.replacing({key: {}})
        return self.replacing({key: self.count(decode_supercuboid(blob, mapper) if whole is None else whole)})

    def deleting(self, keys: Sequence[SupercuboidKey]) -> AbstractContextManager[None]:
        """Around the delete of stored supercuboids."""
        return self.replacing({k: {} for k in keys if self.keeps(k.volume)})

    def forget(self, prefix: str) -> int:
        """Drop every entry and mark left under a channel's prefix (after its purge deleted its
        supercuboids: those of a write that died before its object was put). Returns how many
        supercuboids had some."""
        keys = self.index.indexed(prefix)
        self.index.settle({k: list(c) for k, c in self.index.labels_of(keys).items()})
        return len(keys)

    def count(self, whole: Array) -> Counts | None:
        """label -> voxels of a supercuboid's array; None past `max_labels` labels (dense)."""
        labels, voxels = label_counts(whole)
        if len(labels) > self.max_labels:
            return None
        return dict(zip(labels.tolist(), voxels.tolist()))

    @contextmanager
    def replacing(self, counts: Mapping[SupercuboidKey, Counts | None]) -> Iterator[None]:
        """The index brought to ``counts`` (None: dense) around the caller's object writes, in the
        order that keeps it a superset; left marked if they raise."""
        if not counts:
            yield
            return
        old = self.index.labels_of(list(counts))
        sparse = {k: c for k, c in counts.items() if c is not None}
        dense = [k for k, c in counts.items() if c is None]
        self.index.begin({k: _changed(old[k], c) for k, c in sparse.items()}, WRITING)
        if dense:
            self.index.begin(dict.fromkeys(dense, {}), f"dense: more than {self.max_labels} labels")
        yield
        self.index.settle({k: old[k].keys() - c.keys() for k, c in sparse.items()})
        if dense:
            self.index.settle({k: list(old[k]) for k in dense}, unmark=False)

    # -- reads ------------------------------------------------------------------------------------
    def labels_of(self, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, Counts]:
        return self.index.labels_of(keys)

    def unsettled(self, volume: VolumeKey) -> set[int]:
        """Morton codes of the volume's supercuboids whose entries cannot be trusted (being
        written, left by a crash, dense): their voxels must be read."""
        return set(self.index.unsettled(volume))

    def holding(self, volume: VolumeKey, label: int) -> set[int]:
        """Morton codes of every supercuboid of the volume that may hold ``label``: those listed
        with it and the unsettled ones."""
        return set(self.index.supercuboids_of(volume, label)) | self.unsettled(volume)


def _changed(old: Counts, new: Counts) -> Counts:
    """The labels of ``new`` that ``old`` lacks or counts otherwise."""
    return {label: voxels for label, voxels in new.items() if old.get(label) != voxels}


@dataclass
class Rebuilt:
    incomplete: list[str]  # channels the index did not serve before (registered by the rebuild, or older)
    supercuboids: int = 0  # counted from their objects (absent ones: their entries removed)
    dense: int = 0


def rebuild(keeper: LabelKeeper, objects: ObjectStore, locks: ExclusiveLocks, prefixes: Sequence[str],
            sleep: Callable[[float], None] = time.sleep) -> Rebuilt:
    """`ndstore reindex --labels`: the label index of these channels rebuilt from the objects,
    while the service runs. The channels are registered (incomplete) first; where one was not
    complete, the rebuild waits until every process indexes its stores (`unknown_ttl_s`: a
    process may have found it unregistered just before). Then each stored supercuboid and each
    one the index lists is counted again under its write lock, and the channels are complete.
    The object store is listed whole, once (its keys are hashed: a channel's are everywhere)."""
    done = Rebuilt([p for p in prefixes if not keeper.serves(p)])
    keeper.register(prefixes, complete=False)
    if done.incomplete:
        sleep(keeper.unknown_ttl_s)
    ours = tuple(prefixes)
    keys = sorted({*(k for k in stored_supercuboids(objects) if k.name.startswith(ours)),
                   *(k for p in prefixes for k in keeper.index.indexed(p))})
    for i in range(0, len(keys), REBUILD_BATCH):
        batch = keys[i : i + REBUILD_BATCH]
        with locks.hold([k.name for k in batch]):
            counts = {k: {} if blob is None else keeper.count(decode_supercuboid(blob))
                      for k, blob in _fetched(objects, batch)}
            with keeper.replacing(counts):
                pass
        done.supercuboids += len(batch)
        done.dense += sum(c is None for c in counts.values())
    keeper.index.set_complete(list(prefixes))
    return done


def _fetched(objects: ObjectStore, keys: Sequence[SupercuboidKey]) -> Iterator[tuple[SupercuboidKey, bytes | None]]:
    by_object = {k.object_key: k for k in keys}
    for object_key, blob in objects.get_many(list(by_object)):
        yield by_object[object_key], blob

