"""The API's one JSON parser: control-plane bodies are small, shallow, UTF-8 JSON spelled one way.

Before parsing: at most CONTROL_BODY_LIMIT bytes are read (413 past it) and the nesting depth is
measured on the raw bytes (400 past MAX_DEPTH): json.loads recurses per level, and a few thousand
levels ended in an HTML 500. While parsing: NaN and Infinity (not JSON) and a key given twice
(two meanings: the one applied could differ from the one audited) are refused. The parsed value
is kept on the request for the audit log (audit.py), which then records what the view applied.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from rest_framework import parsers

from ndstore.api.gate import CONTROL_BODY_LIMIT, declared_length
from ndstore.core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

MAX_DEPTH = 32
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted)."""
    brackets = np.frombuffer(_STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"the JSON body holds {name}, which is not a JSON number")


def _one_spelling(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidRequest(f"the JSON body gives {key!r} twice in one object")
        out[key] = value
    return out


def parse_json(raw: bytes) -> Any:
    if nesting_depth(raw) > MAX_DEPTH:
        raise InvalidRequest(f"the JSON body nests deeper than {MAX_DEPTH} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the JSON body is not UTF-8: {exc}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_one_spelling)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None


class StrictJSONParser(parsers.BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        assert parser_context is not None
        params = dict(p.strip().partition("=")[::2] for p in (media_type or "").split(";")[1:])
        if params.get("charset", "utf-8").strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"JSON bodies are UTF-8; Content-Type {media_type!r} names another charset")
        request = parser_context["request"]
        if declared_length(request._request) > CONTROL_BODY_LIMIT:
            raise PayloadTooLarge(f"the JSON body exceeds the {CONTROL_BODY_LIMIT}-byte limit")
        raw = stream.read(CONTROL_BODY_LIMIT + 1) if stream is not None else b""
        if len(raw) > CONTROL_BODY_LIMIT:
            raise PayloadTooLarge(f"the JSON body exceeds the {CONTROL_BODY_LIMIT}-byte limit")
        data = parse_json(raw)
        request._request.ndstore_json = data
        return data
