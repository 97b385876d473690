"""DRF parser and renderer classes, one per cutout media type, over ndstore.core.wire."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from rest_framework import parsers, renderers

from ndstore.core import wire
from ndstore.core.errors import InvalidBody, NotAcceptable, PayloadTooLarge
from ndstore.core.slices import encode_image


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


class CutoutImageRenderer(renderers.BaseRenderer):
    """A box as one greyscale image, the Boss's own renderers (Neuroglancer's boss:// source asks
    uint8 image channels for `image/jpeg`): its (z, y) rows stacked, x across, so the pixels in
    order are the voxels in C order; JPEG for uint8, PNG for uint8 and uint16."""

    charset = None
    render_style = "binary"
    file_format = ""
    dtypes: tuple[str, ...] = ()

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        return encode_image(np.ascontiguousarray(data).reshape(-1, data.shape[-1]), self.file_format)

    max_side = 1 << 31

    @classmethod
    def check(cls, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        """NotAcceptable (406), naming what can be asked for, unless this image holds ``dtype``
        and a box of ``shape`` (t, z, y, x) fits its sides."""
        others = f"ask for one of {', '.join(wire.FORMATS)}" + (
            ", or image/png" if dtype.name in PngCutoutRenderer.dtypes and cls is not PngCutoutRenderer else "")
        if dtype.name not in cls.dtypes:
            raise NotAcceptable(f"{cls.media_type} cutouts hold {' or '.join(cls.dtypes)} voxels; this channel stores "
                                f"{dtype.name}: {others}")
        rows = math.prod(shape[:-1])
        if max(rows, shape[-1]) > cls.max_side:
            raise NotAcceptable(f"an {cls.media_type} image has at most {cls.max_side} pixels a side, and this box "
                                f"makes {rows} rows (its time samples x z x y) of {shape[-1]}: ask for a smaller "
                                f"box, or {others}")


class JpegCutoutRenderer(CutoutImageRenderer):
    media_type, format, file_format, dtypes = "image/jpeg", "jpeg", "jpeg", ("uint8",)
    max_side = 65535  # JPEG's own bound


class PngCutoutRenderer(CutoutImageRenderer):
    media_type, format, file_format, dtypes = "image/png", "png", "png", ("uint8", "uint16")


# after the array formats: a client that accepts anything gets application/blosc
CUTOUT_RENDERERS = [*ARRAY_RENDERERS, JpegCutoutRenderer, PngCutoutRenderer]
