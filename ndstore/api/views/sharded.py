"""Sharded precomputed, read-only and live: `/precomputed-sharded/{c}/{e}/{ch}/info` declares
`neuroglancer_uint64_sharded_v1` per advertised scale, and `.../{scale_key}/{shard}.shard` is a
shard file computed from the cuboids when asked for (ndstore.core.sharded). A `Range` of a shard
reads only the chunks it covers: the shard index and minishard index cost no read at all.
CloudVolume, TensorStore and Neuroglancer read it; CORS and preflights as for every data GET;
permissions those of the cutouts. Chunks are encoded as the unsharded view's default (raw, or
compressed_segmentation for label channels): a compressed_segmentation shard is small and is
encoded whole on every read, since its indexes depend on the encoded sizes.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse
from django.urls import register_converter
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response

from ndstore.api import browser_http, budget, levels
from ndstore.api.schema import errors
from ndstore.api.views.precomputed import (
    INFO,
    NOT_MODIFIED,
    PrecomputedView,
    channel_file,
    channel_for,
    voxel_nm_of,
)
from ndstore.core import precomputed, sharded
from ndstore.core.errors import NotFound
from ndstore.engine.volume import ChannelVolume, Cutout, make_cutout
from ndstore.wiring import services


class ShardNameConverter:
    regex = r"[0-9a-f]{1,16}\.shard"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ShardNameConverter, "shardname")
MEANINGS = {404: "no such collection, experiment, channel, scale key or shard", 416: "the range starts past the end"}


class InfoView(PrecomputedView):
    @extend_schema(summary="A channel's sharded precomputed info", responses={
        200: INFO, 304: NOT_MODIFIED, **errors(400, 401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume, _ = channel_for(request, kw)
        built = levels.built_levels(chan, volume)
        encoding = precomputed.default_encoding(volume)
        body = precomputed.info(volume, voxel_nm_of(chan), encoding, built, products=True)
        for scale in body["scales"]:
            scale["sharding"] = sharded.level_shards(volume, int(scale["key"]), encoding).sharding()
        return channel_file(chan, json.dumps(body).encode(), "application/json")


class ShardView(PrecomputedView):
    @extend_schema(
        summary="One shard file", description="Read a byte range of it: a reader asks for the shard index, then "
                                              "the minishard index, then the chunk's bytes.",
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the shard"),
                   (206, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY,
                                                                      description="the bytes of the Range"),
                   304: NOT_MODIFIED, **errors(400, 401, 403, 404, 413, 416, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume, _ = channel_for(request, kw)
        level = precomputed.level_of_key(kw["key"], volume.num_levels)
        if level not in levels.built_levels(chan, volume):
            raise NotFound(f"scale {level} is not advertised: it holds no data yet")
        encoding = precomputed.default_encoding(volume)
        shards = sharded.level_shards(volume, level, encoding)
        number = shards.shard_of_name(kw["shard"])
        t = chan.default_time_sample
        if encoding != precomputed.RAW:  # built whole: browser_http answers its Range, with the whole's ETag
            return channel_file(chan, _encoded_shard(request, volume, level, t, shards, number),
                                "application/octet-stream")
        pieces = sharded.shard_layout(shards, number)
        total = pieces[-1].start + pieces[-1].size
        header = request.META.get("HTTP_RANGE")
        wanted = browser_http.byte_range(header, total) if header and "HTTP_IF_RANGE" not in request.META else None
        if wanted == "unsatisfiable":
            return browser_http.unsatisfiable(str(header), total)
        first, last = wanted if isinstance(wanted, tuple) else (0, total - 1)
        body = _read(request, volume, level, t, pieces, first, last)
        response = channel_file(chan, body, "application/octet-stream")
        if isinstance(wanted, tuple):
            response.status_code = 206
            response["Content-Range"] = f"bytes {first}-{last}/{total}"
        return response


def _most_supercuboids(cutouts: list[Cutout]) -> Cutout | None:
    """Of chunks read one after another, the one that holds the most supercuboids at once."""
    return max(cutouts, key=lambda c: c.supercuboids, default=None)


def _encoded_shard(request: Any, volume: ChannelVolume, level: int, t: int, shards: sharded.LevelShards,
                   number: int) -> bytes:
    """A whole shard of encoded chunks (compressed_segmentation): every chunk read and encoded."""
    limit = services().config.max_cutout_bytes
    cutouts = [make_cutout(volume, level, box, range(t, t + 1), limit) for _, box in shards.chunks(number)]
    reading = sum(c.nbytes for c in cutouts)
    budget.reserve(request, 2 * reading, _most_supercuboids(cutouts), reading=reading)
    plane = services().plane
    chunks = [precomputed.encode_chunk(plane.read(c)[0], precomputed.COMPRESSED_SEGMENTATION) for c in cutouts]
    head = sharded.shard_layout(shards, number, [len(c) for c in chunks])[0].header
    return b"".join([head or b"", *chunks])


def _read(request: Any, volume: ChannelVolume, level: int, t: int, pieces: list[sharded.Piece], first: int,
          last: int) -> bytes:
    limit = services().config.max_cutout_bytes
    parts = [(piece, lo, hi, None if piece.header is not None
              else make_cutout(volume, level, piece.box, range(t, t + 1), limit))  # type: ignore[arg-type]
             for piece, lo, hi in sharded.overlapping(pieces, first, last)]
    read = [cutout for *_, cutout in parts if cutout is not None]
    reading = sum(piece.size for piece, *_, cutout in parts if cutout is not None)
    budget.reserve(request, 2 * reading, _most_supercuboids(read), reading=reading)
    out = []
    for piece, lo, hi, cutout in parts:
        if cutout is None:
            out.append(piece.header[lo:hi])  # type: ignore[index]
        else:
            out.append(precomputed.encode_chunk(services().plane.read(cutout)[0], precomputed.RAW)[lo:hi])
    return b"".join(out)


@extend_schema(summary="Any other sharded precomputed file", responses=errors(401, 404, 429, meanings={
    404: "no such file; the message lists the files a channel has"}))
class NoSuchFile(PrecomputedView):
    def get(self, request: Any, **kw: Any) -> Response:
        raise NotFound(f"no such sharded precomputed file: {kw.get('rest', '')!r}; a channel has "
                       "/precomputed-sharded/{collection}/{experiment}/{channel}/info and "
                       ".../{scale_key}/{shard number, hex}.shard")


ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("info", InfoView),
    ("<str:key>/<shardname:shard>", ShardView),
]
