"""Segment properties of a label channel in Neuroglancer's `neuroglancer_segment_properties`
format (inline): each label's voxel count and bounding box, read from the label index, merged
with the names, descriptions and tags users wrote (given by the caller: no Django here).

Bounding boxes are supercuboid-aligned, like the Boss's loose `boundingbox`: the union of the
boxes of the supercuboids the index lists the label in, clipped to the level's extent (half-open,
level-0 voxels). Counts and boxes are those of the index entries: a supercuboid recorded "dense"
(more than the index's `max_labels` labels) adds nothing to either until it is rebuilt.

Annotations relate to segments (ndstore.api.views.annotation_layers): `linked` gives, per
property id (`{layer}_{relationship}`), how many annotations each segment has in that
relationship; each becomes a number property (0 for a segment with none), and a segment with
annotations is listed even where the label index holds no voxels of it.

The file is bounded: at most `max_listed` segments and `max_bytes` of JSON (about). When a channel
has more, those users wrote properties for or annotated come first, then the rest, each by voxels
(largest first, then by id); the file's `ndstore` member says how many were left out. Ids are
listed ascending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndstore.core import morton
from ndstore.core.errors import LabelIndexNotServing
from ndstore.core.geometry import Box, Grid
from ndstore.core.keys import VolumeKey
from ndstore.engine.label_index import LabelKeeper

MAX_LISTED = 100_000
MAX_BYTES = 32 << 20
FETCH_BATCH = 1000  # written properties asked of the caller at once
NUMBERS_BYTES = 7 * 12  # the JSON of one segment's seven numbers, at most
UINT32_MAX = (1 << 32) - 1
BOX = ("x0", "y0", "z0", "x1", "y1", "z1")


@dataclass(frozen=True)
class Extent:
    voxels: int
    lo: tuple[int, int, int]
    hi: tuple[int, int, int]


@dataclass(frozen=True)
class Written:
    name: str
    description: str
    tags: Sequence[str]

    @property
    def size(self) -> int:
        """About the bytes of its JSON text (escapes aside: bounded by 6x the characters)."""
        return len(self.name.encode()) + len(self.description.encode()) + sum(len(t) + 4 for t in self.tags) + 8


def label_extents(labels: LabelKeeper | None, volume: VolumeKey, grid: Grid, extent: Box) -> dict[int, Extent]:
    """label -> voxels and supercuboid-aligned box of every label (0 excluded) the index lists in
    the volume. 503 (LabelIndexNotServing) while the index does not serve the channel."""
    if labels is None or not labels.serves(volume.channel_prefix):
        raise LabelIndexNotServing("the label index does not serve this channel yet: segment properties need it "
                                   "(an operator runs `ndstore reindex --labels`)")
    keys = [k for k in labels.index.indexed(volume.channel_prefix) if k.volume == volume]
    found: dict[int, list[int]] = {}  # label -> [voxels, x0, y0, z0, x1, y1, z1]
    for key, counts in labels.labels_of(keys).items():
        box = grid.supercuboid_box(morton.decode_one(key.morton)).intersect(extent)
        if box is None:
            continue
        for label, voxels in counts.items():
            if not label:
                continue
            known = found.get(label)
            if known is None:
                found[label] = [voxels, *box.lo, *box.hi]
                continue
            known[0] += voxels
            known[1:4] = [min(a, b) for a, b in zip(known[1:4], box.lo)]
            known[4:7] = [max(a, b) for a, b in zip(known[4:7], box.hi)]
    return {label: Extent(v[0], (v[1], v[2], v[3]), (v[4], v[5], v[6])) for label, v in found.items()}


def listing_order(extents: Mapping[int, Extent], written: Iterable[int]) -> list[int]:
    """Every segment, in the order the file takes them while it has room: those with written
    properties first, then the rest, each by voxels (largest first), then by id."""
    named = set(written)
    everyone = list(named | extents.keys())
    none = Extent(0, (0, 0, 0), (0, 0, 0))
    voxels = np.fromiter((extents.get(label, none).voxels for label in everyone), np.int64, len(everyone))
    unnamed = np.fromiter((label not in named for label in everyone), bool, len(everyone))
    labels = np.array(everyone, np.uint64)
    return [int(v) for v in labels[np.lexsort((labels, -voxels, unnamed))].tolist()]


def segment_properties(extents: Mapping[int, Extent], written: Iterable[int],
                       fetch: Callable[[list[int]], Mapping[int, Written]],
                       max_listed: int = MAX_LISTED, max_bytes: int = MAX_BYTES,
                       linked: Mapping[str, Mapping[int, int]] | None = None) -> dict[str, Any]:
    """The `info` file: ``written`` names the labels users wrote properties for, ``fetch`` reads
    those of some of them (asked for in batches, only while the file has room); ``linked``: per
    property id, segment -> how many annotations relate to it."""
    named = set(written)
    linked = linked or {}
    order = listing_order(extents, named.union(*(counts.keys() for counts in linked.values())))
    chosen: dict[int, Written | None] = {}
    used = 0
    for start in range(0, min(len(order), max_listed), FETCH_BATCH):
        batch = order[start:min(start + FETCH_BATCH, max_listed)]
        texts = fetch([label for label in batch if label in named]) if named else {}
        for label in batch:
            text = texts.get(label)
            used += len(str(label)) + 4 + NUMBERS_BYTES + 12 * len(linked) + (text.size if text is not None else 0)
            if used > max_bytes:
                break
            chosen[label] = text
        else:
            continue
        break
    ids = sorted(chosen)
    return {"@type": "neuroglancer_segment_properties",
            "inline": {"ids": [str(label) for label in ids],
                       "properties": [*_properties(ids, extents, chosen), *_linked(ids, linked)]},
            "ndstore": {"segments": len(order), "listed": len(ids), "omitted": len(order) - len(ids),
                        "order": "segments with written properties first, then by voxels, largest first",
                        "max_listed": max_listed, "max_bytes": max_bytes}}


def _linked(ids: list[int], linked: Mapping[str, Mapping[int, int]]) -> list[Any]:
    return [{"id": pid, "type": "number", "data_type": "uint32", "values": [counts.get(label, 0) for label in ids],
             "description": f"annotations of the segment in relationship {pid} (annotation layer_relationship)"}
            for pid, counts in sorted(linked.items())]


def _properties(ids: list[int], extents: Mapping[int, Extent], texts: Mapping[int, Written | None]) -> list[Any]:
    none = Extent(0, (0, 0, 0), (0, 0, 0))
    blank = Written("", "", ())
    written = [texts.get(label) or blank for label in ids]
    tags = sorted({tag for w in written for tag in w.tags})
    index = {tag: i for i, tag in enumerate(tags)}
    sizes = [extents.get(label, none) for label in ids]
    voxels = [e.voxels for e in sizes]
    boxes = [(*e.lo, *e.hi) for e in sizes]
    return [
        {"id": "label", "type": "label", "values": [w.name for w in written]},
        {"id": "description", "type": "description", "values": [w.description for w in written]},
        {"id": "tags", "type": "tags", "tags": tags, "values": [sorted(index[t] for t in w.tags) for w in written]},
        {"id": "voxels", "type": "number", "description": "voxels of the segment at level 0 (from the label index)",
         "data_type": "uint32" if max(voxels, default=0) <= UINT32_MAX else "float32", "values": voxels},
        *({"id": name, "type": "number", "data_type": "uint32", "values": [b[i] for b in boxes],
           "description": f"bounding box {'low' if i < 3 else 'high'} {name[0]}, level-0 voxels, supercuboid-aligned "
                          f"({'inclusive' if i < 3 else 'exclusive'}); 0 where the segment has no voxels"}
          for i, name in enumerate(BOX)),
    ]
