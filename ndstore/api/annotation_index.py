"""A layer's served indexes, built from the stored annotations and kept per layer version in
this process (docs/design/annotations.md).

Every write bumps the layer's `version` in the transaction that makes it; a request reads the
layer row (its permission check does anyway) and, when the version differs from the one built,
rebuilds: a write shows in the next request of every worker. A build reads the version again
after the rows: if a write came between, the build answers this request but is not kept.
At most KEPT layers are kept per process, the least recently used dropped first.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ndstore.api.models import Annotation, AnnotationLayer
from ndstore.core.annotations import spatial
from ndstore.core.annotations.layout import Layout

KEPT = 8
KEPT_BYTES = 256 << 20  # the builds a process keeps, all layers together (the newest is always kept)
BUILD_ROW_BYTES = 8 + 48 + 64  # a build's arrays per annotation beside its record: id, box, level arrays
# (reserved as a read, which counts them twice: the batches and their concatenation, the sort's copies)
SPATIAL_LIMIT = 500  # annotations per spatial cell asked of each level but the last
BATCH = 5000
_lock = threading.Lock()
_built: OrderedDict[int, Built] = OrderedDict()
_building: dict[int, threading.Lock] = {}  # per layer: held while it is being built


@dataclass(frozen=True)
class Built:
    version: tuple[object, ...]  # the layer's version, its frame and voxel size (the levels depend on them)
    ids: np.ndarray  # uint64, ascending
    records: np.ndarray  # (n, layout.size) uint8, in the order of ids
    levels: list[spatial.Level]
    seconds: float  # how long the build took

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.records.nbytes
                   + sum(level.keys.nbytes + level.starts.nbytes + level.members.nbytes for level in self.levels))

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Indices of those of ``ids`` the build holds."""
        at = np.searchsorted(self.ids, ids)
        found = at < len(self.ids)
        found[found] = self.ids[at[found]] == ids[found]
        return at[found]


def layout_of(layer: AnnotationLayer) -> Layout:
    return Layout(layer.annotation_type, tuple((p["id"], p["type"]) for p in layer.properties))


def frame_of(layer: AnnotationLayer) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    f = layer.experiment.coord_frame
    return (float(f.x_start), float(f.y_start), float(f.z_start)), (float(f.x_stop), float(f.y_stop), float(f.z_stop))


def _load(layer: AnnotationLayer, voxel: tuple[float, float, float]) -> Built:
    started = time.perf_counter()
    size = layout_of(layer).size
    rows = Annotation.objects.filter(layer=layer).values_list(
        "aid", "lo_x", "lo_y", "lo_z", "hi_x", "hi_y", "hi_z", "record").iterator(chunk_size=BATCH)
    # Rows become arrays BATCH at a time: a million rows (the most a layer holds) kept as Python
    # objects would take several hundred MB of the worker's room (~370 bytes a row), as arrays
    # about 100 (the id, the box and the record).
    ids: list[np.ndarray] = []
    boxes: list[np.ndarray] = []
    blobs: list[bytes] = []
    while batch := list(itertools.islice(rows, BATCH)):
        ids.append(np.array([row[0] for row in batch], np.int64))
        boxes.append(np.array([row[1:7] for row in batch], np.float64).reshape(-1, 6))
        blobs.append(b"".join(bytes(row[7]) for row in batch))
    signed = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(signed.view(np.uint64), kind="stable")
    unsigned = signed.view(np.uint64)[order]
    bounds = (np.concatenate(boxes) if boxes else np.zeros((0, 6)))[order]
    records = np.frombuffer(b"".join(blobs), np.uint8).reshape(-1, size)[order]
    lower, upper = frame_of(layer)
    levels = spatial.build(unsigned, bounds[:, :3], bounds[:, 3:], lower, upper, voxel, SPATIAL_LIMIT)
    return Built(_version(layer, voxel), unsigned, records, levels, time.perf_counter() - started)


def _version(layer: AnnotationLayer, voxel: tuple[float, float, float]) -> tuple[object, ...]:
    return (layer.version, *frame_of(layer), voxel)


def _kept(layer: AnnotationLayer, voxel: tuple[float, float, float]) -> Built | None:
    with _lock:
        kept = _built.get(layer.pk)
        if kept is not None and kept.version == _version(layer, voxel):
            _built.move_to_end(layer.pk)
            return kept
    return None


def build_bytes(layer: AnnotationLayer) -> int:
    """What building the layer's indexes holds at its peak (for the worker's budget)."""
    return Annotation.objects.filter(layer=layer).count() * (BUILD_ROW_BYTES + layout_of(layer).size)


def built(layer: AnnotationLayer, voxel: tuple[float, float, float],
          reserve: Callable[[int], None] = lambda _: None) -> Built:
    """The layer's indexes at its version (``layer`` was read by this request). One build of a
    layer at a time in this process: the requests a viewer sends at once after a write (a dozen
    cells) wait for that build instead of each making its own, a second of CPU apiece at 100,000.
    ``reserve(bytes)`` is called before a build, with what it will hold (it may refuse: raise)."""
    kept = _kept(layer, voxel)
    if kept is not None:
        return kept
    with _lock:
        building = _building.setdefault(layer.pk, threading.Lock())
    with building:
        kept = _kept(layer, voxel)
        if kept is not None:
            return kept
        reserve(build_bytes(layer))
        return _build_and_keep(layer, voxel)


def _build_and_keep(layer: AnnotationLayer, voxel: tuple[float, float, float]) -> Built:
    fresh = _load(layer, voxel)
    now = AnnotationLayer.objects.filter(pk=layer.pk).values_list("version", flat=True).first()
    if now == layer.version:
        with _lock:
            _built[layer.pk] = fresh
            _built.move_to_end(layer.pk)
            while len(_built) > KEPT or (len(_built) > 1 and sum(b.nbytes for b in _built.values()) > KEPT_BYTES):
                _built.popitem(last=False)
    return fresh


def forget(layer_pk: int) -> None:
    with _lock:
        _built.pop(layer_pk, None)
        _building.pop(layer_pk, None)


def forget_all() -> None:
    with _lock:
        _built.clear()
        _building.clear()
