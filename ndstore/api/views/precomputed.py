"""Neuroglancer "precomputed", read-only, so Neuroglancer and CloudVolume read a channel with no
plug-in: `/precomputed/{c}/{e}/{ch}/info` and `.../{scale_key}/{x0}-{x1}_{y0}-{y1}_{z0}-{z1}`
chunks, read through the cache tier. `.../{c}/{e}/{ch}/{encoding}/...` (`raw` or
`compressed_segmentation`) is the same volume in an encoding other than the channel's default.
Every response, errors and preflights included, carries CORS headers (ndstore.api.browser_http).
The path tails are here (ROUTES, with their converters); ndstore.api.urls mounts them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import HttpResponse
from django.urls import register_converter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, browser_http, budget, levels, lookups
from ndstore.api.caching import cacheable
from ndstore.api.models import Channel
from ndstore.api.schema import errors
from ndstore.core import precomputed
from ndstore.core.chunks import decompress_cuboid
from ndstore.core.errors import NotFound
from ndstore.core.geometry import Box
from ndstore.engine.volume import ChannelVolume, Cutout, make_cutout
from ndstore.wiring import services

log = logging.getLogger("ndstore.views")


class ChunkNameConverter:
    """`x0-x1_y0-y1_z0-z1` -> ((x0, x1), (y0, y1), (z0, z1)); emptiness and order are checked
    by the geometry, with a clear 400. ASCII digits only, as the cutout ranges (RangeConverter)."""

    regex = r"[0-9]{1,12}-[0-9]{1,12}_[0-9]{1,12}-[0-9]{1,12}_[0-9]{1,12}-[0-9]{1,12}"

    def to_python(self, value: str) -> tuple[tuple[int, int], ...]:
        return tuple((int(a), int(b)) for a, b in (r.split("-") for r in value.split("_")))

    def to_url(self, value: tuple[tuple[int, int], ...]) -> str:
        return "_".join(f"{a}-{b}" for a, b in value)


class EncodingConverter:
    regex = f"(?:{'|'.join(precomputed.ENCODINGS)})"  # grouped: the OpenAPI pattern anchors it whole

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ChunkNameConverter, "chunkname")
register_converter(EncodingConverter, "encoding")


class AnyAccept(BaseContentNegotiation):
    """Viewers send whatever Accept they like; a file is what it is (errors are JSON)."""

    def select_parser(self, request: Any, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Any, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


class PrecomputedView(APIView):
    """CORS, ETags, Range and HEAD: ndstore.api.browser_http, around every /precomputed/ answer."""

    content_negotiation_class = AnyAccept

    def options(self, request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
        return browser_http.preflight()


def channel_for(request: Any, kw: dict[str, Any]) -> tuple[Channel, ChannelVolume, str]:
    """The channel (read permission checked), its engine volume and the encoding asked for."""
    coll, exp, chan = lookups.channel_path(kw["collection"], kw["experiment"], kw["channel"])
    auth.require(request.user, auth.READ, coll, exp, chan)
    volume = lookups.channel_volume(chan)
    encoding = kw.get("encoding")
    if encoding is None:
        return chan, volume, precomputed.default_encoding(volume)
    return chan, volume, precomputed.check_encoding(encoding, volume)


FILE_ERRORS = {
    400: "bad range, or an encoding the channel cannot have",
    404: "no such collection, experiment, channel or scale key",
    413: "the chunk is over NDSTORE_MAX_CUTOUT_BYTES",
}
NOT_MODIFIED = OpenApiResponse(None, description="not modified: the If-None-Match ETag still holds")


def _xyz() -> serializers.ListField:
    return serializers.ListField(child=serializers.IntegerField(), min_length=3, max_length=3)


INFO = inline_serializer("PrecomputedInfo", {
    "@type": serializers.CharField(help_text="neuroglancer_multiscale_volume"),
    "type": serializers.ChoiceField(choices=["image", "segmentation"]),
    "data_type": serializers.CharField(help_text="the channel's datatype"),
    "num_channels": serializers.IntegerField(),
    "scales": inline_serializer("PrecomputedScale", {
        "key": serializers.CharField(help_text="the resolution level"),
        "size": _xyz(), "voxel_offset": _xyz(),
        "resolution": serializers.ListField(child=serializers.FloatField(), help_text="nm per voxel, x y z"),
        "chunk_sizes": serializers.ListField(child=_xyz(), help_text="one: the level's cuboid shape"),
        "encoding": serializers.ChoiceField(choices=list(precomputed.ENCODINGS)),
        "compressed_segmentation_block_size": serializers.ListField(child=serializers.IntegerField(),
                                                                    required=False),
    }, many=True, help_text="one per resolution level, finest first"),
})


def channel_file(chan: Channel, body: bytes, content_type: str, revalidate: bool = False) -> HttpResponse:
    """A file of a channel's views (precomputed, sharded, zarr), cacheable as its collection allows."""
    return cacheable(body, content_type, chan.experiment.collection.public, "Authorization", revalidate)


def voxel_nm_of(chan: Channel) -> tuple[float, float, float]:
    frame = chan.experiment.coord_frame
    return precomputed.voxel_size_nm((frame.x_voxel_size, frame.y_voxel_size, frame.z_voxel_size), frame.voxel_unit)


class InfoView(PrecomputedView):
    @extend_schema(summary="A channel's precomputed info", responses={
        200: INFO, 304: NOT_MODIFIED, **errors(400, 401, 403, 404, 429, meanings=FILE_ERRORS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume, encoding = channel_for(request, kw)
        built = levels.built_levels(chan, volume)
        # a label channel's products are named in its default info (they are not per encoding)
        body = json.dumps(precomputed.info(volume, voxel_nm_of(chan), encoding, built, products="encoding" not in kw))
        return channel_file(chan, body.encode(), "application/json")


class ChunkView(PrecomputedView):
    @extend_schema(
        summary="One precomputed chunk",
        description="Raw chunks are little-endian voxels, x fastest; compressed_segmentation ones use 8x8x8 blocks. "
                    "Read through the cache tier at the channel's default_time_sample.",
        parameters=[OpenApiParameter("key", str, OpenApiParameter.PATH, description="scale key: the resolution level"),
                    OpenApiParameter("box", str, OpenApiParameter.PATH, pattern=f"^{ChunkNameConverter.regex}$",
                                     description="x0-x1_y0-y1_z0-z1: half-open voxel ranges of the level")],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the chunk"),
                   304: NOT_MODIFIED,
                   **errors(400, 401, 403, 404, 413, 429, 500, 503, meanings=FILE_ERRORS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume, encoding = channel_for(request, kw)
        level = precomputed.level_of_key(kw["key"], volume.num_levels)
        box = Box.from_ranges(*kw["box"])
        t = chan.default_time_sample
        cutout = make_cutout(volume, level, box, range(t, t + 1), services().config.max_cutout_bytes)
        budget.reserve(request, cutout.nbytes, cutout, reading=cutout.nbytes)
        return channel_file(chan, chunk_file(volume, level, cutout, encoding), "application/octet-stream")


def chunk_file(volume: ChannelVolume, level: int, cutout: Cutout, encoding: str) -> bytes:
    """A raw chunk that is one whole cuboid is the stored cuboid decompressed (one lock-free
    snapshot, none of the read's planning or placing); any other chunk, or when the cache tier
    or NDBlaze's pending writes say the stored blob is not the live state, the voxels read."""
    data = None
    if encoding == precomputed.RAW and is_one_cuboid(cutout.box, volume.grid(level).cuboid):
        blob = services().plane.stored(cutout)
        if blob is not None:
            data = decompress_cuboid(blob, volume.dtype, cutout.box.shape_zyx)
    return precomputed.encode_chunk(services().plane.read(cutout)[0] if data is None else data, encoding)


def is_one_cuboid(box: Box, cuboid: tuple[int, int, int]) -> bool:
    return all(lo % c == 0 and hi - lo == c for lo, hi, c in zip(box.lo, box.hi, cuboid))


@extend_schema(summary="Any other precomputed file", responses=errors(401, 404, 429, meanings={
    404: "no such file; the message lists the files a channel has"}))
class NoSuchFile(PrecomputedView):
    """Any other path under /precomputed/ (`provenance`, probes for other formats): a 404 that
    says which files exist."""

    def get(self, request: Any, **kw: Any) -> Response:
        raise NotFound(
            f"no such precomputed file: {kw.get('rest', '')!r}; a channel has "
            "/precomputed/{collection}/{experiment}/{channel}/[{encoding}/]info and "
            ".../[{encoding}/]{scale_key}/{x0}-{x1}_{y0}-{y1}_{z0}-{z1} (integer, half-open ranges; "
            f"encoding one of {', '.join(precomputed.ENCODINGS)})"
        )


# Tails under /precomputed/{collection}/{experiment}/{channel}/, mounted by ndstore.api.urls.
ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("info", InfoView),
    ("<str:key>/<chunkname:box>", ChunkView),
    ("<encoding:encoding>/info", InfoView),
    ("<encoding:encoding>/<str:key>/<chunkname:box>", ChunkView),
]
