"""Slice images for viewers: `GET /v1/image/{c}/{e}/{ch}/{xy|xz|yz}/{res}/...` through the cache
tier, as PNG (default) or JPEG (`?format=jpeg` or `Accept: image/jpeg`), with `?window=lo,hi`
and, for JPEG, `?quality=`. An ETag of the image answers a repeat with 304; Cache-Control lets a
viewer's cache keep a tile for a short while (data can be rewritten at any time)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import renderers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, budget, lookups
from ndstore.api.caching import cacheable
from ndstore.api.errors import JSONErrors
from ndstore.api.schema import binary_responses, errors
from ndstore.core import slices
from ndstore.core.errors import InvalidRequest
from ndstore.core.geometry import Box
from ndstore.engine.volume import make_cutout
from ndstore.wiring import services


class _ImageRenderer(renderers.BaseRenderer):
    """Picks the format from Accept or ?format=; the view encodes the image itself."""

    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> Any:
        return data


class PNGRenderer(_ImageRenderer):
    media_type, format = "image/png", "png"


class JPEGRenderer(_ImageRenderer):
    media_type, format = "image/jpeg", "jpeg"


class SliceImageView(JSONErrors, APIView):
    renderer_classes = [PNGRenderer, JPEGRenderer]
    orientation = "xy"

    @extend_schema(
        summary="One plane as an image",
        description="Read through the cache tier, rows down the image. Without a window: uint8 as stored, uint16 "
                    "as 16-bit greyscale PNG (JPEG: through its full range), wider integers through their full "
                    "range, float32 through 0,1. Annotation channels: a colour per label id (PNG: RGBA, label 0 "
                    "transparent). Viewers may keep it 30 s; its ETag answers a matching If-None-Match with 304.",
        parameters=[
            OpenApiParameter("format", str, enum=["png", "jpeg"], description="instead of Accept (PNG by default)"),
            OpenApiParameter("window", str, pattern=r"^[^,]+,[^,]+$",
                             description="lo,hi: maps lo to 0 and hi to 255, clipping outside"),
            OpenApiParameter("quality", int, description="JPEG quality, 1..95 (default 85)"),
        ],
        responses={**binary_responses(200, [PNGRenderer.media_type, JPEGRenderer.media_type], "the plane"),
                   304: OpenApiResponse(None, description="not modified: the If-None-Match ETag still holds"),
                   **errors(400, 401, 403, 404, 406, 413, 429, 500, 503, meanings={
                       400: "bad window, quality, range, resolution or time",
                       404: "no such collection, experiment or channel",
                       413: "the plane is over NDSTORE_MAX_CUTOUT_BYTES"})})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        """The image, for DRF's dispatch and the data routes' own (ndstore/api/data_routes.py)."""
        coll, exp, chan = lookups.channel_path(kw["collection"], kw["experiment"], kw["channel"])
        auth.require(request.user, auth.READ, coll, exp, chan)
        ranges = {axis: kw[axis] if isinstance(kw[axis], tuple) else (kw[axis], kw[axis] + 1) for axis in "xyz"}
        t = kw.get("t", chan.default_time_sample)
        cutout = make_cutout(lookups.channel_volume(chan), kw["resolution"],
                             Box.from_ranges(ranges["x"], ranges["y"], ranges["z"]), range(t, t + 1),
                             services().config.max_cutout_bytes)
        budget.reserve(request, cutout.nbytes, cutout, reading=cutout.nbytes)
        file_format = request.accepted_renderer.format
        window = request.GET.get("window")
        quality = _quality(request.GET.get("quality", "85"))
        data = services().plane.read(cutout)[0]
        pixels = slices.displayable(slices.plane_of(data, self.orientation), chan.type == "annotation",
                                    slices.Window.parse(window) if window else None, file_format)
        body = slices.encode_image(pixels, file_format, quality)
        return cacheable(body, request.accepted_renderer.media_type, coll.public, "Accept, Authorization")


class XYImage(SliceImageView):
    orientation = "xy"


class XZImage(SliceImageView):
    orientation = "xz"


class YZImage(SliceImageView):
    orientation = "yz"


@extend_schema(summary="Malformed image URL", description="A 400 showing the three URL shapes.",
               responses=errors(400, 401, 429))
class MalformedImage(APIView):
    def get(self, request: Any, **kw: Any) -> Response:
        raise InvalidRequest(
            "malformed image URL; expected /v1/image/{collection}/{experiment}/{channel}/ then "
            "xy/{res}/{x0}:{x1}/{y0}:{y1}/{z}/, xz/{res}/{x0}:{x1}/{y}/{z0}:{z1}/ or "
            "yz/{res}/{x}/{y0}:{y1}/{z0}:{z1}/, optionally followed by {t}/"
        )


def _quality(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 95:
        raise InvalidRequest(f"quality must be an integer 1..95, not {raw!r}")
    return int(raw)
