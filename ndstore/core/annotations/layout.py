"""How one annotation is laid out in bytes (the section "Single annotation encoding" of Neuroglancer's
src/datasource/precomputed/annotations.md): its geometry as float32le, then its property values grouped by
alignment (4-byte types, then 2-byte, then 1-byte, rgb and rgba; each group in the info's order),
zero padding to a multiple of 4 bytes; the annotation id index appends, per relationship, a uint32le
count and the uint64le ids. A list (a spatial cell, a relationship index entry) is a uint64le count,
the records, then the uint64le ids.

Records are built for many annotations at once as one numpy structured array whose fields sit at
the spec's offsets (`Layout.dtype`), and sent as its bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ndstore.core.errors import InvalidRequest

GEOMETRY_FLOATS = {"point": 3, "line": 6, "axis_aligned_bounding_box": 6, "ellipsoid": 6}
NEUROGLANCER_TYPE = {"point": "POINT", "line": "LINE", "axis_aligned_bounding_box": "AXIS_ALIGNED_BOUNDING_BOX",
                     "ellipsoid": "ELLIPSOID"}
# property type -> (numpy type, components, alignment group: 0 first)
PROPERTY_TYPES: dict[str, tuple[str, int, int]] = {
    "uint32": ("<u4", 1, 0), "int32": ("<i4", 1, 0), "float32": ("<f4", 1, 0),
    "uint16": ("<u2", 1, 1), "int16": ("<i2", 1, 1),
    "uint8": ("u1", 1, 2), "int8": ("i1", 1, 2), "rgb": ("u1", 3, 2), "rgba": ("u1", 4, 2),
}
COLOURS = ("rgb", "rgba")


@dataclass(frozen=True)
class Layout:
    """The byte layout of one annotation of a layer: its type and its properties' (id, type) in
    the info's order."""

    annotation_type: str
    properties: tuple[tuple[str, str], ...]

    @property
    def floats(self) -> int:
        return GEOMETRY_FLOATS[self.annotation_type]

    @property
    def offsets(self) -> dict[str, int]:
        """property id -> its byte offset in a record."""
        at = 4 * self.floats
        out = {}
        for group in range(3):
            for pid, kind in self.properties:
                code, n, g = PROPERTY_TYPES[kind]
                if g == group:
                    out[pid] = at
                    at += np.dtype(code).itemsize * n
        return out

    @property
    def size(self) -> int:
        """Bytes of one record (geometry, properties, padding), relationships aside."""
        end = 4 * self.floats + sum(np.dtype(PROPERTY_TYPES[k][0]).itemsize * PROPERTY_TYPES[k][1]
                                    for _, k in self.properties)
        return -(-end // 4) * 4

    @property
    def dtype(self) -> np.dtype:
        offsets = self.offsets
        names = ["geometry", *(pid for pid, _ in self.properties)]
        formats: list[object] = [("<f4", (self.floats,))]
        for _, kind in self.properties:
            code, n, _ = PROPERTY_TYPES[kind]
            formats.append((code, (n,)) if n > 1 else code)
        return np.dtype({"names": names, "formats": formats, "offsets": [0, *(offsets[p] for p, _ in self.properties)],
                         "itemsize": self.size})


def records(layout: Layout, geometry: np.ndarray, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """(n, layout.size) uint8: the records of n annotations; ``geometry`` is (n, floats),
    ``values`` each property's n values (n x 3 or n x 4 for colours), already checked to fit."""
    out = np.zeros(len(geometry), layout.dtype)
    out["geometry"] = geometry
    for pid, _ in layout.properties:
        out[pid] = values[pid]
    return out.view(np.uint8).reshape(len(geometry), layout.size)


def with_relationships(record: bytes, related: Sequence[Sequence[int]]) -> bytes:
    """One annotation as the annotation id index has it: its record, then each relationship's ids."""
    parts = [record]
    for ids in related:
        parts.append(np.uint32(len(ids)).astype("<u4").tobytes())
        parts.append(np.asarray(ids, np.uint64).astype("<u8").tobytes())
    return b"".join(parts)


def annotation_list(rows: np.ndarray, ids: np.ndarray) -> bytes:
    """Several annotations (a spatial cell, a relationship index entry): the count, the records
    (an (n, size) uint8 array), the ids."""
    return b"".join((np.uint64(len(ids)).astype("<u8").tobytes(), rows.tobytes(),
                     np.asarray(ids, np.uint64).astype("<u8").tobytes()))


def check_value(kind: str, value: float, where: str) -> None:
    """A number fits the property type (integers for the integer types, float32's range)."""
    code = PROPERTY_TYPES[kind][0]
    if np.dtype(code).kind == "f":
        if not np.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
            raise InvalidRequest(f"{where}: {value!r} is not a finite float32")
        return
    info = np.iinfo(code)
    if isinstance(value, float) and not value.is_integer():
        raise InvalidRequest(f"{where}: {value!r} is not an integer ({kind})")
    if not info.min <= value <= info.max:
        raise InvalidRequest(f"{where}: {value!r} is outside {kind} ({info.min}..{info.max})")
