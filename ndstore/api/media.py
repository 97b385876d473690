"""DRF parser and renderer classes, one per cutout media type, over ndstore.core.wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rest_framework import parsers, renderers

from ndstore.core import wire
from ndstore.core.errors import InvalidBody, PayloadTooLarge


def read_capped_body(stream: Any, view: Any, request: Any) -> bytes:
    """The whole request body, refused (413) past the view's max_body_bytes() and (400) empty."""
    limit = view.max_body_bytes()
    declared = int(request.META.get("CONTENT_LENGTH") or 0)
    if declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    body: bytes = stream.read(limit + 1) if stream is not None else b""
    if len(body) > limit:
        raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
    if not body:
        raise InvalidBody("request body is empty")
    return body


class ArrayParser(parsers.BaseParser):
    """Reads a capped body and decodes it to the array the view expects (view.body_spec())."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        assert parser_context is not None
        body = read_capped_body(stream, parser_context["view"], parser_context["request"])
        shape, dtype = parser_context["view"].body_spec()
        return wire.format_for(self.media_type).decode(body, shape, np.dtype(dtype))


@dataclass(frozen=True)
class RawBody:
    media_type: str
    body: bytes


class RawBodyParser(parsers.BaseParser):
    """Reads a capped body and keeps it as it arrived (NDBlaze stores bodies undecoded)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        assert parser_context is not None
        return RawBody(self.media_type, read_capped_body(stream, parser_context["view"], parser_context["request"]))


class ArrayRenderer(renderers.BaseRenderer):
    charset = None
    render_style = "binary"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        return wire.format_for(self.media_type).encode(data)


def _classes(base: type, prefix: str) -> list[type]:
    return [
        type(f"{prefix}{name.split('/')[1].title().replace('-', '')}", (base,),
             {"media_type": name, "format": name.split("/")[1]})
        for name in wire.FORMATS
    ]


# application/blosc first: it is what the Boss answers when a client accepts anything.
ARRAY_PARSERS = _classes(ArrayParser, "Parser")
ARRAY_RENDERERS = _classes(ArrayRenderer, "Renderer")
RAW_BODY_PARSERS = _classes(RawBodyParser, "RawParser")
