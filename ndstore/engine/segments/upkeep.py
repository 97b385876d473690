"""Keeping a label channel's segmentation products current with its voxels
(docs/design/segmentation.md).

1. Where a supercuboid of level 0 reaches or leaves the base tier (`BaseTier.store`, the one
   place every write path goes through), `changed` marks its fragments stale and the fragments
   of its seven low-side neighbours (theirs reach one voxel into it), and queues a rebuild of
   each: a stale mark is an object (`_ndstore-seg&stale&<name>`, the write's time and a token),
   a rebuild a message on the products queue (`<ingest prefix>-seg`).
2. `rebuild` (the local runner, a Lambda on SQS, or a Spark job over a whole volume) builds every
   product of one supercuboid from the base tier's voxels of the supercuboid plus that one-voxel
   overlap, stores each kind's fragment object, and removes the mark only if no write marked it
   again meanwhile (checked under the write locks of the supercuboid and its high-side
   neighbours, which every writer that marks it holds). A message whose mark is gone is a
   duplicate: nothing to do. Until a rebuild lands the last good fragment is served.
3. A supercuboid past a product's bounds is skipped with its reason recorded
   (`_ndstore-seg&skipped&<kind>&<name>`); its last good fragment stays.

Which channels: those the label index keeps (every annotation channel) whose product spec is
recorded (`_ndstore-seg&spec&<channel prefix>`: the geometry and voxel size a rebuild needs,
sealed with the service's key, written when the channel is created or a build is asked for).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy.typing as npt

from ndstore.core import morton
from ndstore.core.geometry import Box
from ndstore.core.keys import SEPARATOR, SupercuboidKey, VolumeKey
from ndstore.core.observe import NULL, Observer
from ndstore.core.segments.bounds import Skipped
from ndstore.core.signing import Signer
from ndstore.engine.dataplane import Read
from ndstore.engine.label_index import LabelKeeper
from ndstore.engine.segments.fragments import LOW_SIDE, PREFIX, Fragments, low_side
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import ExclusiveLocks, ObjectStore, QueueCounts, WorkQueue

log = logging.getLogger("ndstore.segments")
Array = npt.NDArray[Any]
XYZ = tuple[int, int, int]
VoxelNm = tuple[float, float, float]
STALE = f"{PREFIX}stale{SEPARATOR}"
SKIPPED = f"{PREFIX}skipped{SEPARATOR}"
SPEC = f"{PREFIX}spec{SEPARATOR}"
SPEC_TTL_S = 10.0  # how long a process trusts what it read of a channel's spec (or its absence)
STATUS_AGES = 1000  # stale marks whose age a status reads at most


class Builder(Protocol):
    def __call__(self, block: Array, box: Box, cell: XYZ, voxel_nm: VoxelNm, extent: Box) -> bytes | None:
        """The fragment object of one supercuboid (``box``) from ``block``, its labels plus one
        voxel on each high side where the volume's ``extent`` continues; None: no labels.
        Raises Skipped."""


class Voxels(Protocol):
    def read(self, cutout: Cutout, mode: Read = Read.LIVE) -> Array: ...


@dataclass(frozen=True)
class ProductSpec:
    channel: ChannelVolume
    voxel_nm: VoxelNm

    def to_json(self) -> str:
        return json.dumps({"channel": self.channel.to_dict(), "voxel_nm": list(self.voxel_nm)})

    @classmethod
    def from_json(cls, raw: str) -> ProductSpec:
        spec = json.loads(raw)
        return cls(ChannelVolume.from_dict(spec["channel"]), tuple(spec["voxel_nm"]))


@dataclass(frozen=True)
class ProductQueue:
    queues: WorkQueue
    name: str
    visibility_s: int
    max_tries: int


def _name_of(mark_key: str, prefix: str) -> str:
    return mark_key[len(prefix):]


def affected(spec: ProductSpec, stored: Iterable[int], t: int) -> list[SupercuboidKey]:
    """Every supercuboid whose fragments the stored supercuboids (Morton codes, level 0, time
    sample ``t``) reach: themselves and their low-side neighbours."""
    volume = spec.channel.volume_key(0, t)
    return [volume.supercuboid(code) for code in sorted(low_side(stored))]


class ProductUpkeep:
    def __init__(self, objects: ObjectStore, fragments: Fragments, labels: LabelKeeper, locks: ExclusiveLocks,
                 plane: Voxels | None, builders: Mapping[str, Builder], queue: Callable[[], ProductQueue],
                 signer: Callable[[], Signer], observer: Observer = NULL, clock: Callable[[], float] = time.time):
        """``plane``: the data plane, whose base tier a rebuild reads (given once built, when
        None here: the base tier it reads is built with this upkeep).
        ``queue`` and ``signer`` (the service's key: a spec is sealed with it, so whoever can
        write the object store cannot point a rebuild at another channel) are made on first
        use: most processes that store supercuboids never touch a label channel."""
        self.objects = objects
        self.fragments = fragments
        self.labels = labels
        self.locks = locks
        self.plane = plane
        self.builders = builders
        self._queue_factory = queue
        self._signer_factory = signer
        self._signer: Signer | None = None
        self.observer = observer
        self._clock = clock
        self._queue: tuple[ProductQueue, str] | None = None
        self._specs: dict[str, tuple[float, ProductSpec | None]] = {}
        self._guard = threading.Lock()

    # -- specs --------------------------------------------------------------------------------------
    @property
    def signer(self) -> Signer:
        if self._signer is None:
            self._signer = self._signer_factory()
        return self._signer

    def describe(self, spec: ProductSpec) -> None:
        """Record (or refresh) the channel's product spec: from now on its writes are kept."""
        name = f"{SPEC}{spec.channel.name_prefix}"
        self.objects.put_many({name: self.signer.seal(name, spec.to_json()).encode()})
        with self._guard:
            self._specs[spec.channel.name_prefix] = (self._clock() + SPEC_TTL_S, spec)

    def spec(self, channel_prefix: str) -> ProductSpec | None:
        with self._guard:
            until, spec = self._specs.get(channel_prefix, (0.0, None))
        if self._clock() < until:
            return spec
        name = f"{SPEC}{channel_prefix}"
        found = None
        for _, body in self.objects.get_many([name]):
            if body is not None:
                found = ProductSpec.from_json(self.signer.open(name, body.decode()))
        with self._guard:
            self._specs[channel_prefix] = (self._clock() + SPEC_TTL_S, found)
        return found

    # -- writers ------------------------------------------------------------------------------------
    def changed(self, keys: Sequence[SupercuboidKey]) -> None:
        """Supercuboids stored or deleted: mark the fragments they affect stale and queue their
        rebuild (level 0 of channels with a spec only)."""
        kept = [k for k in keys if k.volume.resolution == 0 and self.labels.keeps(k.volume)
                and self.spec(k.volume.channel_prefix) is not None]
        if not kept:
            return
        affected = sorted({k.volume.supercuboid(code) for k in kept for code in low_side([k.morton])})
        self.mark(affected)

    def mark(self, keys: Sequence[SupercuboidKey]) -> int:
        if not keys:
            return 0
        now = self._clock()
        self.objects.put_many({f"{STALE}{k.name}": json.dumps({"since": now, "token": uuid.uuid4().hex}).encode()
                               for k in keys})
        queue, url = self._products_queue()
        sent = queue.queues.send(url, (json.dumps({"supercuboid": k.name}) for k in keys))
        self.observer.count("segment_marked_total", len(keys))
        return sent

    def _products_queue(self) -> tuple[ProductQueue, str]:
        if self._queue is None:
            queue = self._queue_factory()
            # on AWS the stack made it, with the trigger of its function (deploy/aws/ingest.yaml)
            url = queue.queues.url(queue.name) or queue.queues.create(queue.name, queue.visibility_s, queue.max_tries)
            self._queue = (queue, url)
        return self._queue

    # -- the rebuild task ---------------------------------------------------------------------------
    def handle(self, body: str) -> str:
        """One queued rebuild (a message body); returns what it did."""
        return self.rebuild(SupercuboidKey.from_name(str(json.loads(body)["supercuboid"])))

    def rebuild(self, key: SupercuboidKey, force: bool = False) -> str:
        """Build the supercuboid's products if marked stale (``force``: whether marked or not,
        as a whole-volume build does); returns what it did."""
        mark = self._mark_of(key)
        if mark is None and not force:
            return "fresh"  # a duplicate message: an earlier rebuild saw the same write
        spec = self.spec(key.volume.channel_prefix)
        if spec is None:  # the channel's products were dropped (its purge): nothing to build
            return "no spec"
        started = self._clock()
        box, block = self._block(spec.channel, key)
        outcomes = ["empty"] if box is None else [self._build_one(kind, build, key, spec, box, block)
                                                  for kind, build in self.builders.items()]
        outcome = "skipped" if "skipped" in outcomes else outcomes[0]  # a kind skipped is what to report
        if mark is not None:
            with self.locks.hold(self._markers_of(key)):
                if self._mark_of(key) == mark:
                    self.objects.delete_many([f"{STALE}{key.name}"])
        done = self._clock()
        self.observer.observe("segment_rebuild_seconds", done - started)
        if mark is not None:
            self.observer.observe("segment_rebuild_lag_seconds", done - float(mark["since"]))
        self.observer.count("segment_rebuilds_total", outcome=outcome)
        return outcome

    def _build_one(self, kind: str, build: Builder, key: SupercuboidKey, spec: ProductSpec, box: Box,
                   block: Array | None) -> str:
        skipped_name = f"{SKIPPED}{kind}{SEPARATOR}{key.name}"
        try:
            blob = None if block is None else build(block, box, spec.channel.grid(0).supercuboid, spec.voxel_nm,
                                                     spec.channel.extent(0))
        except Skipped as exc:
            log.warning("%s of supercuboid %s skipped: %s", kind, key.name, exc)
            self.objects.put_many({skipped_name: json.dumps({"reason": str(exc), "at": self._clock()}).encode()})
            return "skipped"
        if blob is None:
            self.fragments.delete(kind, [key])
        else:
            self.fragments.put(kind, key, blob)
        self.objects.delete_many([skipped_name])
        return "built"

    def _block(self, channel: ChannelVolume, key: SupercuboidKey) -> tuple[Box | None, Array | None]:
        """The supercuboid's box (clipped to the extent) and its voxels plus one voxel on each
        high side where the extent continues; None for an all-zero block."""
        extent = channel.extent(0)
        box = channel.grid(0).supercuboid_box(morton.decode_one(key.morton)).intersect(extent)
        if box is None:
            return None, None
        grown = Box(box.lo, tuple(min(h + 1, e) for h, e in zip(box.hi, extent.hi)))  # type: ignore[arg-type]
        t = key.volume.time
        assert self.plane is not None, "the upkeep reads through the data plane it is given"
        data = self.plane.read(Cutout(channel, 0, grown, range(t, t + 1)), Read.RAW)[0]  # what the base holds
        return box, (data if data.any() else None)

    def _mark_of(self, key: SupercuboidKey) -> dict[str, Any] | None:
        for _, body in self.objects.get_many([f"{STALE}{key.name}"]):
            if body is not None:
                return json.loads(body)  # type: ignore[no-any-return]
        return None

    @staticmethod
    def _markers_of(key: SupercuboidKey) -> list[str]:
        """The supercuboid and its high-side neighbours: a store of any of them marks it."""
        x, y, z = morton.decode_one(key.morton)
        return [key.volume.supercuboid(morton.encode_one(x + dx, y + dy, z + dz)).name for dx, dy, dz in LOW_SIDE]

    # -- a whole channel ----------------------------------------------------------------------------
    def build_all(self, spec: ProductSpec, stored: Iterable[int], t: int) -> int:
        """Describe the channel and mark (and queue) every fragment its stored supercuboids of
        level 0, time sample ``t``, affect; returns how many."""
        self.describe(spec)
        keys = affected(spec, stored, t)
        for i in range(0, len(keys), 1000):
            self.mark(keys[i : i + 1000])
        return len(keys)

    def status(self, volume: VolumeKey, label: int | None = None) -> dict[str, Any]:
        """What is stale (how many, since when), what was skipped and why, and the queue; for
        one segment (``label``), only what holds it."""
        stale = [_name_of(k, STALE) for k in self.objects.list_keys(f"{STALE}{volume.partition}{SEPARATOR}")]
        if label is not None:
            holding = {k.name for k in self.fragments.holding(volume, label)}
            stale = [name for name in stale if name in holding]
        now = self._clock()
        ages = [now - float(json.loads(body)["since"])
                for _, body in self.objects.get_many([f"{STALE}{n}" for n in stale[:STATUS_AGES]]) if body]
        skipped = []
        for kind in self.builders:
            prefix = f"{SKIPPED}{kind}{SEPARATOR}"
            names = [_name_of(k, prefix) for k in self.objects.list_keys(f"{prefix}{volume.partition}{SEPARATOR}")]
            for name, body in zip(names, (b for _, b in self.objects.get_many([prefix + n for n in names[:100]]))):
                if body:
                    skipped.append({"kind": kind, "supercuboid": name, "reason": json.loads(body)["reason"]})
        pending = self.queued()
        return {"stale": len(stale), "lag_s": round(max(ages), 3) if ages else 0.0, "skipped": skipped,
                "queue": {"waiting": pending.waiting, "in_flight": pending.in_flight}}

    def queued(self) -> QueueCounts:
        """The rebuilds waiting and under way, over every channel."""
        queue, url = self._products_queue()
        return queue.queues.counts(url)

    def forget(self, channel_prefix: str) -> int:
        """Delete every product object of a channel (its voxels were purged)."""
        prefixes = [f"{PREFIX}{what}{SEPARATOR}{channel_prefix}" for what in ("mesh", "skeleton", "stale")]
        prefixes += [f"{SKIPPED}{kind}{SEPARATOR}{channel_prefix}" for kind in self.builders]
        names = [k for prefix in prefixes for k in self.objects.list_keys(prefix)] + [f"{SPEC}{channel_prefix}"]
        for i in range(0, len(names), 1000):
            self.objects.delete_many(names[i : i + 1000])
        with self._guard:
            self._specs.pop(channel_prefix, None)
        return len(names)
