"""Bodies of annotation writes, bounded before they are parsed: at most CONTROL_BODY_LIMIT bytes
(the request gate refuses a larger declared length before a byte is read; the parsers read no
more), and at most MAX_PER_REQUEST annotations, counted on the raw bytes: the items of the JSON
list (commas at depth one, strings removed) or the CSV's lines. JSON also nests at most MAX_DEPTH
levels, has no NaN or Infinity and no key twice (ndstore.api.json_body).

JSON: a list of objects {"id", geometry ("point" | "pointA", "pointB" | "center", "radii"),
"properties": {id: value}, "relationships": {id: [segment ids]}, "type"?}. CSV: a header row
naming the columns (`id`, the type's geometry columns, property ids, relationship ids; docs/api.md),
then one row per annotation; a relationship's cell lists its segment ids separated by spaces.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import numpy as np
from rest_framework import parsers

from ndstore.api.annotation_input import (
    CSV_GEOMETRY,
    JSON_GEOMETRY,
    Batch,
    Target,
    annotation_id,
    property_value,
    segment_ids,
)
from ndstore.api.gate import CONTROL_BODY_LIMIT, declared_length
from ndstore.api.json_body import parse_json
from ndstore.core.annotations.layout import COLOURS, PROPERTY_TYPES
from ndstore.core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

MAX_PER_REQUEST = 10_000
ITEM_FIELDS = ("id", "type", "properties", "relationships")
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
NUMBER = re.compile(r"\A-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?\Z")
INTEGER = re.compile(r"\A-?[0-9]{1,20}\Z")


def _bounded(stream: Any, parser_context: dict[str, Any] | None, what: str) -> bytes:
    assert parser_context is not None
    if declared_length(parser_context["request"]._request) > CONTROL_BODY_LIMIT:
        raise PayloadTooLarge(f"the {what} body exceeds the {CONTROL_BODY_LIMIT}-byte limit")
    raw: bytes = stream.read(CONTROL_BODY_LIMIT + 1) if stream is not None else b""
    if len(raw) > CONTROL_BODY_LIMIT:
        raise PayloadTooLarge(f"the {what} body exceeds the {CONTROL_BODY_LIMIT}-byte limit")
    return raw


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the {what} body is not UTF-8: {exc}") from None


def _charset(media_type: str | None) -> None:
    params = dict(p.strip().partition("=")[::2] for p in (media_type or "").split(";")[1:])
    if params.get("charset", "utf-8").strip('"').lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(f"annotation bodies are UTF-8; Content-Type {media_type!r} names another charset")


def json_items(raw: bytes) -> int:
    """How many items the top-level JSON list holds, counted without parsing (at most one too
    many: `[]` counts 1)."""
    marks = np.frombuffer(_STRINGS.sub(b"", raw).translate(None, _NOT_STRUCTURE), np.uint8)
    opening = (marks == ord("[")) | (marks == ord("{"))
    depth = np.cumsum(np.where(opening, 1, np.where(marks == ord(","), 0, -1)))
    commas = int(((marks == ord(",")) & (depth == 1)).sum())
    return commas + 1


class AnnotationJSONParser(parsers.BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        _charset(media_type)
        raw = _bounded(stream, parser_context, "JSON")
        if json_items(raw) > MAX_PER_REQUEST:
            raise PayloadTooLarge(f"the body lists more than {MAX_PER_REQUEST} annotations; send at most "
                                  f"{MAX_PER_REQUEST} per request")
        data = parse_json(raw)
        parser_context["request"]._request.ndstore_json = data  # type: ignore[index]  # for the audit log
        return data


class CSVText:
    """A CSV body, not parsed yet (the view parses it knowing the layer's columns)."""

    def __init__(self, text: str):
        self.text = text


class AnnotationCSVParser(parsers.BaseParser):
    media_type = "text/csv"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        _charset(media_type)
        raw = _bounded(stream, parser_context, "CSV")
        rows = raw.count(b"\n") + (0 if raw.endswith(b"\n") or not raw else 1) - 1  # less the header
        if rows > MAX_PER_REQUEST:
            raise PayloadTooLarge(f"the CSV body has more than {MAX_PER_REQUEST} rows; send at most "
                                  f"{MAX_PER_REQUEST} per request")
        if b"\x00" in raw:
            raise InvalidRequest("the CSV body holds a NUL byte")
        return CSVText(_utf8(raw, "CSV"))


def _point(raw: Any, where: str) -> list[float]:
    if not isinstance(raw, list) or len(raw) != 3 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                         for v in raw):
        raise InvalidRequest(f"{where} must be a list of 3 numbers (x, y, z)")
    return [float(v) for v in raw]


def _defaults(target: Target) -> dict[str, Any]:
    return {p["id"]: [0] * PROPERTY_TYPES[p["type"]][1] if p["type"] in COLOURS else 0 for p in target.properties}


def _json_item(item: Any, target: Target, where: str) -> tuple[int, list[float], dict[str, Any], list[list[int]]]:
    geometry_keys = JSON_GEOMETRY[target.annotation_type]
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be a JSON object, not {type(item).__name__}")
    unknown = sorted(set(item) - set(ITEM_FIELDS) - set(geometry_keys))
    if unknown:
        raise InvalidRequest(f"{where} has unknown fields {unknown[:5]}; a {target.annotation_type} annotation has "
                             f"{', '.join((*ITEM_FIELDS, *geometry_keys))}")
    if item.get("type", target.annotation_type) != target.annotation_type:
        raise InvalidRequest(f"{where}: the layer holds {target.annotation_type} annotations")
    missing = [k for k in ("id", *geometry_keys) if k not in item]
    if missing:
        raise InvalidRequest(f"{where} needs {', '.join(missing)}")
    geometry = [v for k in geometry_keys for v in _point(item[k], f"{where}.{k}")]
    props, rels = item.get("properties", {}), item.get("relationships", {})
    if not isinstance(props, dict) or not isinstance(rels, dict):
        raise InvalidRequest(f"{where}: properties and relationships are JSON objects keyed by their ids")
    values = _defaults(target)
    specs = {p["id"]: p for p in target.properties}
    for pid, raw in props.items():
        if pid not in specs:
            raise InvalidRequest(f"{where}.properties: the layer has no property {pid[:64]!r}")
        values[pid] = property_value(raw, specs[pid], f"{where}.properties.{pid}")
    unknown = sorted(set(rels) - set(target.relationships))
    if unknown:
        raise InvalidRequest(f"{where}.relationships: the layer has no relationship {unknown[0][:64]!r}")
    related = [segment_ids(rels[r], target.top, f"{where}.relationships.{r}") if r in rels else []
               for r in target.relationships]
    return annotation_id(item["id"], f"{where}.id"), geometry, values, related


def parse_json_annotations(raw: Any, target: Target) -> Batch:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("the body must be a non-empty JSON list of annotations")
    if len(raw) > MAX_PER_REQUEST:
        raise PayloadTooLarge(f"the body lists {len(raw)} annotations; at most {MAX_PER_REQUEST} per request")
    batch = Batch()
    for i, item in enumerate(raw):
        batch.add(*_json_item(item, target, f"annotation {i}"), where=f"annotation {i}")
    return batch


def _csv_number(text: str, where: str) -> float:
    if not NUMBER.match(text):
        raise InvalidRequest(f"{where}: {text[:40]!r} is not a decimal number")
    return float(text)


def _csv_value(text: str, spec: dict[str, Any], where: str) -> Any:
    kind = spec["type"]
    if kind in COLOURS:
        return property_value(text, spec, where)
    if text == "":
        return 0
    if PROPERTY_TYPES[kind][0].endswith("f4"):
        return property_value(_csv_number(text, where), spec, where)
    if not INTEGER.match(text):
        raise InvalidRequest(f"{where}: {text[:40]!r} is not an integer ({kind})")
    return property_value(int(text), spec, where)


def _header(row: list[str], target: Target) -> dict[str, int]:
    geometry = CSV_GEOMETRY[target.annotation_type]
    known = ("id", *geometry, *(p["id"] for p in target.properties), *target.relationships)
    unknown = [c for c in row if c not in known]
    if unknown:
        raise InvalidRequest(f"CSV header: unknown column {unknown[0][:64]!r}; a {target.annotation_type} layer's "
                             f"columns are {', '.join(known)}")
    if len(set(row)) != len(row):
        raise InvalidRequest("CSV header: a column is named twice")
    missing = [c for c in ("id", *geometry) if c not in row]
    if missing:
        raise InvalidRequest(f"CSV header: the columns {', '.join(missing)} are missing")
    return {name: i for i, name in enumerate(row)}


def _csv_row(row: list[str], columns: dict[str, int], target: Target,
             where: str) -> tuple[int, list[float], dict[str, Any], list[list[int]]]:
    if len(row) != len(columns):
        raise InvalidRequest(f"{where} has {len(row)} fields; the header names {len(columns)}")
    geometry = [_csv_number(row[columns[c]], f"{where}, column {c}") for c in CSV_GEOMETRY[target.annotation_type]]
    values = _defaults(target)
    for spec in target.properties:
        if spec["id"] in columns:
            values[spec["id"]] = _csv_value(row[columns[spec["id"]]], spec, f"{where}, column {spec['id']}")
    related = []
    for rel in target.relationships:
        cell = row[columns[rel]].split() if rel in columns else []
        related.append(segment_ids(cell, target.top, f"{where}, column {rel}") if cell else [])
    return annotation_id(row[columns["id"]], f"{where}, column id"), geometry, values, related


def parse_csv_annotations(body: CSVText, target: Target) -> Batch:
    reader = csv.reader(io.StringIO(body.text, newline=""), strict=True)
    batch = Batch()
    try:
        header = next(reader, None)
        if header is None:
            raise InvalidRequest("the CSV body is empty: it needs a header row and annotations")
        columns = _header([c.strip() for c in header], target)
        for row in reader:
            if not row:
                continue
            where = f"CSV line {reader.line_num}"
            batch.add(*_csv_row([c.strip() for c in row], columns, target, where), where=where)
    except csv.Error as exc:
        raise InvalidRequest(f"the CSV body does not parse: {exc}") from None
    if not batch.ids:
        raise InvalidRequest("the CSV body holds no annotations")
    return batch
