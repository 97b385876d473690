"""A decoder of Neuroglancer's precomputed annotation encodings, written from the spec
(google/neuroglancer src/datasource/precomputed/annotations.md) with `struct`, apart from the
server's numpy encoder, so that tests check one against the other."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

FLOATS = {"POINT": 3, "LINE": 6, "AXIS_ALIGNED_BOUNDING_BOX": 6, "ELLIPSOID": 6}
FORMATS = {"uint32": "<I", "int32": "<i", "float32": "<f", "uint16": "<H", "int16": "<h", "uint8": "<B",
           "int8": "<b", "rgb": "<3B", "rgba": "<4B"}
ORDER = [("uint32", "int32", "float32"), ("uint16", "int16"), ("uint8", "int8", "rgb", "rgba")]


@dataclass
class Decoded:
    geometry: tuple[float, ...]
    properties: dict[str, Any]
    id: int | None = None
    related: list[list[int]] = field(default_factory=list)


def _one(data: bytes, at: int, info: dict[str, Any]) -> tuple[Decoded, int]:
    n = FLOATS[info["annotation_type"]]
    geometry = struct.unpack_from(f"<{n}f", data, at)
    at += 4 * n
    values: dict[str, Any] = {}
    for group in ORDER:
        for prop in info["properties"]:
            if prop["type"] in group:
                fmt = FORMATS[prop["type"]]
                got = struct.unpack_from(fmt, data, at)
                values[prop["id"]] = list(got) if len(got) > 1 else got[0]
                at += struct.calcsize(fmt)
    at += -at % 4  # padding to a multiple of 4 (records start 4-aligned after the count)
    return Decoded(geometry, values), at


def single(data: bytes, info: dict[str, Any]) -> Decoded:
    """The by_id encoding: one annotation, then each relationship's count and ids."""
    annotation, at = _one(data, 0, info)
    for _ in info["relationships"]:
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        annotation.related.append(list(struct.unpack_from(f"<{count}Q", data, at)))
        at += 8 * count
    assert at == len(data), f"{len(data) - at} bytes left over"
    return annotation


def multiple(data: bytes, info: dict[str, Any]) -> list[Decoded]:
    """The spatial / relationship index encoding: count, annotations, ids."""
    (count,) = struct.unpack_from("<Q", data, 0)
    at, out = 8, []
    for _ in range(count):
        annotation, end = _one(data, at, info)
        out.append(annotation)
        at = end
    for annotation in out:
        (annotation.id,) = struct.unpack_from("<Q", data, at)
        at += 8
    assert at == len(data), f"{len(data) - at} bytes left over"
    return out
