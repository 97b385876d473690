"""What a client may write into an annotation layer, checked with a 400 naming what is wrong.

A layer (POST /v1/annotations/{c}/{e}/{layer}/): `annotation_type` (point, line,
axis_aligned_bounding_box, ellipsoid), at most MAX_PROPERTIES typed `properties` (Neuroglancer's
info form: id, type, description, enum_values with enum_labels), at most MAX_RELATIONSHIPS
`relationships` (ids) and the `segmentation` they refer to: a label channel of the same experiment.

Annotations, as JSON objects or CSV rows (docs/api.md, "Annotations"): a uint64 id (1 .. 2^64-1,
a decimal string or a JSON integer), the geometry of the layer's type in level-0 voxel
coordinates of the experiment's frame (finite float32 numbers, the annotation's box inside the
frame; an ellipsoid's radii not negative), a value per property (missing: 0) that fits its type
(and its enum), and per relationship at most MAX_RELATED segment ids of the label channel's
datatype (1 .. its maximum). Parsing makes the arrays the layer stores (`Batch`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndstore.api.segment_input import CONTROL, DECIMAL, parse_id
from ndstore.core.annotations.layout import COLOURS, GEOMETRY_FLOATS, PROPERTY_TYPES, Layout, check_value, records
from ndstore.core.errors import InvalidRequest

MAX_PROPERTIES = 16
MAX_RELATIONSHIPS = 8
MAX_RELATED = 64
MAX_ENUM = 256
TOP = (1 << 64) - 1
PROPERTY_ID = re.compile(r"\A[a-z][a-zA-Z0-9_]{0,63}\Z")  # Neuroglancer's rule, and at most 64 characters
JSON_GEOMETRY = {"point": ("point",), "line": ("pointA", "pointB"), "axis_aligned_bounding_box": ("pointA", "pointB"),
                 "ellipsoid": ("center", "radii")}
CSV_GEOMETRY = {"point": ("x", "y", "z"), "line": ("ax", "ay", "az", "bx", "by", "bz"),
                "axis_aligned_bounding_box": ("ax", "ay", "az", "bx", "by", "bz"),
                "ellipsoid": ("x", "y", "z", "rx", "ry", "rz")}
LAYER_FIELDS = ("annotation_type", "description", "properties", "relationships", "segmentation")
SPEC_FIELDS = ("id", "type", "description", "enum_values", "enum_labels")


@dataclass(frozen=True)
class Target:
    """What a layer takes: its type, properties (info form), relationships, the largest segment
    id of its label channel and the frame (level-0 voxels)."""

    annotation_type: str
    properties: Sequence[dict[str, Any]]
    relationships: Sequence[str]
    top: int
    lower: tuple[float, float, float]
    upper: tuple[float, float, float]

    @property
    def layout(self) -> Layout:
        return Layout(self.annotation_type, tuple((p["id"], p["type"]) for p in self.properties))


@dataclass
class Batch:
    """Parsed annotations, one row each: what the layer stores."""

    ids: list[int] = field(default_factory=list)
    geometry: list[list[float]] = field(default_factory=list)
    values: dict[str, list[Any]] = field(default_factory=dict)
    related: list[list[list[int]]] = field(default_factory=list)  # per annotation, per relationship

    def add(self, aid: int, geometry: list[float], values: dict[str, Any], related: list[list[int]],
            where: str) -> None:
        if aid in self._seen:
            raise InvalidRequest(f"{where}: id {aid} is given twice in this request")
        self._seen.add(aid)
        self.ids.append(aid)
        self.geometry.append(geometry)
        for pid, value in values.items():
            self.values.setdefault(pid, []).append(value)
        self.related.append(related)

    def __post_init__(self) -> None:
        self._seen: set[int] = set()


def _text(raw: Any, limit: int, where: str) -> str:
    if not isinstance(raw, str) or len(raw) > limit or CONTROL.search(raw):
        raise InvalidRequest(f"{where} must be a string of at most {limit} characters without control characters")
    return raw


def _property_id(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not PROPERTY_ID.match(raw):
        raise InvalidRequest(f"{where} must match [a-z][a-zA-Z0-9_]* (at most 64 characters), not {str(raw)[:80]!r}")
    return raw


def parse_property_spec(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where} must be an object with {', '.join(SPEC_FIELDS)}")
    unknown = sorted(set(raw) - set(SPEC_FIELDS))
    if unknown:
        raise InvalidRequest(f"{where} has unknown fields {unknown[:5]}; a property has {', '.join(SPEC_FIELDS)}")
    spec: dict[str, Any] = {"id": _property_id(raw.get("id"), f"{where}.id")}
    kind = raw.get("type")
    if kind not in PROPERTY_TYPES:
        raise InvalidRequest(f"{where}.type must be one of {', '.join(PROPERTY_TYPES)}, not {str(kind)[:40]!r}")
    spec["type"] = kind
    if "description" in raw:
        spec["description"] = _text(raw["description"], 1024, f"{where}.description")
    if ("enum_values" in raw) != ("enum_labels" in raw):
        raise InvalidRequest(f"{where}: enum_values and enum_labels go together")
    if "enum_values" in raw:
        values, labels = raw["enum_values"], raw["enum_labels"]
        if kind in COLOURS or not isinstance(values, list) or not isinstance(labels, list) \
                or not 0 < len(values) == len(labels) <= MAX_ENUM:
            raise InvalidRequest(f"{where}: enum_values and enum_labels are lists of the same length (1.."
                                 f"{MAX_ENUM}), for a numeric type")
        for i, value in enumerate(values):
            _number(value, kind, f"{where}.enum_values[{i}]")
        spec["enum_values"] = values
        spec["enum_labels"] = [_text(label, 128, f"{where}.enum_labels[{i}]") for i, label in enumerate(labels)]
    return spec


def parse_layer(raw: Any) -> dict[str, Any]:
    """A layer's description: its fields checked; `segmentation` is still a channel name."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"the body must be a JSON object with {', '.join(LAYER_FIELDS)}")
    unknown = sorted(set(raw) - set(LAYER_FIELDS))
    if unknown:
        raise InvalidRequest(f"the body has unknown fields {unknown[:5]}; a layer has {', '.join(LAYER_FIELDS)}")
    kind = raw.get("annotation_type")
    if kind not in GEOMETRY_FLOATS:
        raise InvalidRequest(f"annotation_type must be one of {', '.join(GEOMETRY_FLOATS)}, not {str(kind)[:40]!r}")
    props, rels = raw.get("properties", []), raw.get("relationships", [])
    if not isinstance(props, list) or len(props) > MAX_PROPERTIES:
        raise InvalidRequest(f"properties must be a list of at most {MAX_PROPERTIES} properties")
    if not isinstance(rels, list) or len(rels) > MAX_RELATIONSHIPS:
        raise InvalidRequest(f"relationships must be a list of at most {MAX_RELATIONSHIPS} ids")
    specs = [parse_property_spec(p, f"properties[{i}]") for i, p in enumerate(props)]
    names = [_property_id(r, f"relationships[{i}]") for i, r in enumerate(rels)]
    for what, ids in (("property", [s["id"] for s in specs]), ("relationship", names)):
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"a {what} id is given twice")
    segmentation = raw.get("segmentation")
    if names and not isinstance(segmentation, str):
        raise InvalidRequest("relationships refer to the segments of a label channel: name it in `segmentation` (a "
                             "channel of this experiment)")
    if segmentation is not None and not isinstance(segmentation, str):
        raise InvalidRequest("segmentation must be the name of a label channel of this experiment")
    return {"annotation_type": kind, "properties": specs, "relationships": names, "segmentation": segmentation,
            "description": _text(raw.get("description", ""), 4096, "description")}


def _number(raw: Any, kind: str, where: str) -> float | int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidRequest(f"{where} must be a number ({kind}), not {type(raw).__name__}")
    check_value(kind, raw, where)
    return raw


def _colour(raw: Any, kind: str, where: str) -> list[int]:
    n = 3 if kind == "rgb" else 4
    if isinstance(raw, str) and re.fullmatch(f"#[0-9a-fA-F]{{{2 * n}}}", raw):
        return [int(raw[i:i + 2], 16) for i in range(1, 2 * n, 2)]
    if isinstance(raw, list) and len(raw) == n and all(type(v) is int and 0 <= v <= 255 for v in raw):
        return raw
    raise InvalidRequest(f"{where} must be '#' and {2 * n} hex digits, or a list of {n} integers 0..255 ({kind})")


def property_value(raw: Any, spec: dict[str, Any], where: str) -> Any:
    kind = spec["type"]
    if kind in COLOURS:
        return _colour(raw, kind, where)
    value = _number(raw, kind, where)
    if "enum_values" in spec and value not in spec["enum_values"]:
        raise InvalidRequest(f"{where}: {value!r} is none of the property's enum_values")
    return value


def annotation_id(raw: Any, where: str) -> int:
    """An annotation id: 1 .. 2^64-1, a JSON integer or a decimal string (ASCII digits, no sign or
    leading zero)."""
    if type(raw) is int:
        value = raw
    elif not isinstance(raw, str):
        raise InvalidRequest(f"{where} must be a decimal string or an integer, not {type(raw).__name__}")
    elif not DECIMAL.match(raw):
        raise InvalidRequest(f"{where} must be 1-20 ASCII digits without sign or leading zero, not {raw[:40]!r}")
    else:
        value = int(raw)
    if not 0 < value <= TOP:
        raise InvalidRequest(f"{where}: {value} is not an annotation id (1 .. 2^64-1)")
    return value


def segment_ids(raw: Any, top: int, where: str) -> list[int]:
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_RELATED:
        raise InvalidRequest(f"{where} lists {len(items)} segments; at most {MAX_RELATED}")
    out = [annotation_id(item, where) if type(item) is int else parse_id(item, top, where) for item in items]
    if any(s > top for s in out):
        raise InvalidRequest(f"{where}: a segment id is beyond the label channel's datatype (at most {top})")
    if len(set(out)) != len(out):
        raise InvalidRequest(f"{where} names a segment twice")
    return sorted(out)


def arrays(target: Target, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(geometry as float32, lo, hi, records) of a parsed batch, its geometry checked: finite
    float32, radii not negative, boxes inside the frame."""
    with np.errstate(over="ignore", invalid="ignore"):
        geometry = np.array(batch.geometry, np.float64).astype(np.float32)
    bad = ~np.isfinite(geometry).all(axis=1)
    if bad.any():
        raise InvalidRequest(f"annotation {int(np.argmax(bad))}: coordinates must be finite float32 numbers")
    g = geometry.astype(np.float64)
    if target.annotation_type == "ellipsoid":
        if (g[:, 3:] < 0).any():
            raise InvalidRequest(f"annotation {int(np.argmax((g[:, 3:] < 0).any(axis=1)))}: radii must not be negative")
        lo, hi = g[:, :3] - g[:, 3:], g[:, :3] + g[:, 3:]
    elif target.annotation_type == "point":
        lo, hi = g, g
    else:
        lo, hi = np.minimum(g[:, :3], g[:, 3:]), np.maximum(g[:, :3], g[:, 3:])
    outside = (lo < np.array(target.lower)).any(axis=1) | (hi > np.array(target.upper)).any(axis=1)
    if outside.any():
        i = int(np.argmax(outside))
        raise InvalidRequest(f"annotation {i} (id {batch.ids[i]}) reaches outside the experiment's frame "
                             f"{list(target.lower)}..{list(target.upper)} (level-0 voxels)")
    values = {pid: np.array(batch.values.get(pid, [0] * len(batch.ids))) for pid, _ in target.layout.properties}
    return geometry, lo, hi, records(target.layout, geometry, values)
