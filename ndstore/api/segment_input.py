"""What a client may write about a segment (a label of an annotation channel), checked field by
field with a 400 naming what is wrong: ids are decimal strings (ASCII digits, no sign, no leading
zero: one spelling per id; JSON numbers lose precision past 2^53), 1 .. the channel's datatype
maximum (0 is the background); a name of at most MAX_NAME characters and a description of at most
MAX_DESCRIPTION, without control characters (a description may hold line breaks and tabs) or lone
surrogates; at most MAX_TAGS distinct tags of TAG's charset (Neuroglancer: no spaces, no '#')."""

from __future__ import annotations

import re
from typing import Any

from ndstore.core.errors import InvalidRequest
from ndstore.engine.segments.properties import Written

MAX_NAME = 256
MAX_DESCRIPTION = 4096
MAX_TAGS = 32
MAX_TAG = 64
MAX_PER_REQUEST = 10_000
TAG = re.compile(rf"\A[A-Za-z0-9_.:+-]{{1,{MAX_TAG}}}\Z")
TAG_RULE = f"1-{MAX_TAG} ASCII letters, digits, '_', '.', ':', '+' or '-'"
DECIMAL = re.compile(r"\A[1-9][0-9]{0,19}\Z")  # str pattern, but [0-9]: ASCII digits only
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
FIELDS = ("id", "name", "description", "tags")


def parse_id(raw: Any, top: int, where: str = "id") -> int:
    """A segment id as the path or a body spells it: 1 .. ``top`` (the channel's datatype maximum)."""
    if not isinstance(raw, str):
        raise InvalidRequest(f"{where} must be a decimal string such as \"12\" (JSON numbers lose precision past "
                             f"2^53), not {type(raw).__name__}")
    if raw == "0":
        raise InvalidRequest(f"{where}: id 0 is the background, not a segment")
    if not DECIMAL.match(raw):
        raise InvalidRequest(f"{where} must be 1-20 ASCII digits without sign or leading zero, not {raw[:40]!r}")
    label = int(raw)
    if label > top:
        raise InvalidRequest(f"{where}: id {raw} is beyond the channel's datatype (at most {top})")
    return label


def _text(raw: Any, field: str, limit: int, lines: bool, where: str) -> str:
    if not isinstance(raw, str):
        raise InvalidRequest(f"{where}.{field} must be a string, not {type(raw).__name__}")
    if len(raw) > limit:
        raise InvalidRequest(f"{where}.{field} is longer than {limit} characters ({len(raw)})")
    if (CONTROL_BUT_LINES if lines else CONTROL).search(raw):
        allowed = " (line breaks and tabs are allowed)" if lines else ""
        raise InvalidRequest(f"{where}.{field} holds a control character or a lone surrogate{allowed}")
    return raw


def _tags(raw: Any, where: str) -> list[str]:
    if not isinstance(raw, list):
        raise InvalidRequest(f"{where}.tags must be a list of strings, not {type(raw).__name__}")
    if len(raw) > MAX_TAGS:
        raise InvalidRequest(f"{where}.tags holds {len(raw)} tags; at most {MAX_TAGS}")
    for tag in raw:
        if not isinstance(tag, str) or not TAG.match(tag):
            shown = tag[:80] if isinstance(tag, str) else type(tag).__name__
            raise InvalidRequest(f"{where}.tags: {shown!r} is not a tag; tags are {TAG_RULE}")
    if len({tag.lower() for tag in raw}) != len(raw):
        raise InvalidRequest(f"{where}.tags names a tag twice (tags are matched case-insensitively)")
    return list(raw)


def parse_segment(raw: Any, top: int, where: str = "the body", path_id: int | None = None) -> tuple[int, Written]:
    """One segment's properties: {"id", "name", "description", "tags"}; with ``path_id`` (a PUT of
    one segment) the id comes from the path and the body may repeat it."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where} must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"{where} has unknown fields {unknown[:5]}; a segment has {', '.join(FIELDS)}")
    if path_id is None or "id" in raw:
        if "id" not in raw:
            raise InvalidRequest(f"{where} needs an id")
        label = parse_id(raw["id"], top, f"{where}.id")
        if path_id is not None and label != path_id:
            raise InvalidRequest(f"{where}.id {label} differs from the id in the path, {path_id}")
    else:
        label = path_id
    return label, Written(_text(raw.get("name", ""), "name", MAX_NAME, False, where),
                          _text(raw.get("description", ""), "description", MAX_DESCRIPTION, True, where),
                          _tags(raw.get("tags", []), where))


def parse_bulk(raw: Any, top: int) -> dict[int, Written]:
    """A list of segments, each id once."""
    if not isinstance(raw, list):
        raise InvalidRequest(f"the body must be a JSON list of segments, not {type(raw).__name__}")
    if not raw:
        raise InvalidRequest("the body lists no segments")
    if len(raw) > MAX_PER_REQUEST:
        raise InvalidRequest(f"the body lists {len(raw)} segments; at most {MAX_PER_REQUEST} per request")
    out: dict[int, Written] = {}
    for i, item in enumerate(raw):
        label, written = parse_segment(item, top, f"segment {i}")
        if label in out:
            raise InvalidRequest(f"segment {i}: id {label} is listed twice")
        out[label] = written
    return out
