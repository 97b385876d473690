"""Skeletons of a label channel, read-only, in Neuroglancer's precomputed skeleton format:
`/precomputed/{c}/{e}/{ch}/skeletons/info` and `.../skeletons/{segment id}` (one file a
segment), `/precomputed-sharded/{c}/{e}/{ch}/skeletons/info` and `.../skeletons/{shard}.shard`
(`neuroglancer_uint64_sharded_v1`). Each is merged when asked for from the stored per-supercuboid
fragments (ndstore.core.segments.skeleton) of level 0 at the channel's default_time_sample: the
segment's fragments come from the label index (`services().fragments`), a shard's segments from
the index's labels. A shard is built whole and browser_http answers its Range (readers ask for
the shard index, the minishard index, then the segment's bytes); it holds a label of 65,536.
Permissions, CORS, ETags and HEAD as the chunk views; 503 while the label index does not serve
the channel. What a request reads (fragment objects) is capped at NDSTORE_MAX_CUTOUT_BYTES and
charged to its caller's read budget.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema

from ndstore.api import budget
from ndstore.api.schema import errors
from ndstore.api.views.precomputed import NOT_MODIFIED, PrecomputedView, channel_file, channel_for
from ndstore.api.views.sharded import ShardNameConverter  # noqa: F401  (registers `shardname`)
from ndstore.core.errors import InvalidRequest, NotFound, PayloadTooLarge
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.core.segments import skeleton
from ndstore.wiring import services

KIND = "skeleton"
MEANINGS = {400: "a segment id that is not a decimal uint64 above 0",
            404: "no such collection, experiment, label channel, segment skeleton or shard",
            416: "the range starts past the end", 503: "the label index does not serve this channel yet"}
INFO = OpenApiResponse(OpenApiTypes.OBJECT, description="neuroglancer_skeletons info")
FILE = OpenApiResponse(OpenApiTypes.BINARY, description="the file")


def label_volume(request: Any, kw: dict[str, Any]) -> tuple[Any, VolumeKey]:
    """The channel (read permission checked) and the volume of its products; 404 unless it is a
    label channel."""
    chan, volume, _ = channel_for(request, kw)
    if not volume.annotation:
        raise NotFound(f"channel {kw['channel']!r} is not a label (annotation) channel: it has no skeletons")
    return chan, volume.volume_key(0, chan.default_time_sample)


def segment_id(text: str) -> int:
    """A segment id as Neuroglancer and CloudVolume write it: decimal, 1 .. 2^64-1, no sign or
    leading zero."""
    if not (text.isascii() and text.isdigit()) or len(text) > 20 or text.startswith("0") or int(text) >= 1 << 64:
        raise InvalidRequest(f"bad segment id {text[:40]!r}: a decimal integer from 1 to 18446744073709551615")
    return int(text)


def fragments_of(request: Any, volume: VolumeKey, keys: list[SupercuboidKey]) -> dict[SupercuboidKey, bytes]:
    """The stored fragment objects of these supercuboids, within the request's read limits."""
    blobs = services().fragments.get_many(KIND, keys)
    reading = sum(len(blob) for blob in blobs.values())
    limit = services().config.max_cutout_bytes
    if reading > limit:
        raise PayloadTooLarge(f"this file is merged from {reading} bytes of fragments: over the {limit} a request "
                              "may read (NDSTORE_MAX_CUTOUT_BYTES)")
    budget.reserve(request, reading, None, reading=reading)
    return blobs


class InfoView(PrecomputedView):
    sharded = False

    @extend_schema(summary="A label channel's skeleton info", responses={
        200: INFO, 304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, _ = label_volume(request, kw)
        body = skeleton.info(skeleton.SHARDS.sharding() if self.sharded else None)
        return channel_file(chan, json.dumps(body).encode(), "application/json")


class ShardedInfoView(InfoView):
    sharded = True

    @extend_schema(summary="A label channel's sharded skeleton info", responses={
        200: INFO, 304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        return super().read(request, kw)


class SkeletonView(PrecomputedView):
    @extend_schema(summary="One segment's skeleton", description=(
        "Neuroglancer precomputed: uint32 vertex count, uint32 edge count, float32 x y z (nm) per vertex, uint32 "
        "vertex pairs, float32 radius (nm) per vertex."),
        responses={(200, "application/octet-stream"): FILE, 304: NOT_MODIFIED,
                   **errors(400, 401, 403, 404, 413, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = label_volume(request, kw)
        label = segment_id(kw["segment"])
        blobs = fragments_of(request, volume, services().fragments.holding(volume, label))
        body = skeleton.skeleton_of([blobs[key] for key in sorted(blobs)], label)  # one order: one file, one ETag
        if body is None:
            raise NotFound(f"segment {label} has no skeleton (no voxels, or too few to skeletonize, or its "
                           "fragments are not built yet)")
        return channel_file(chan, body, "application/octet-stream")


class ShardView(PrecomputedView):
    @extend_schema(summary="One shard of skeletons", description=(
        "neuroglancer_uint64_sharded_v1, hash identity: the segments whose id's low 16 bits are the shard number. "
        "Read a byte range of it: the shard index, then the minishard index, then a segment's bytes."),
        responses={(200, "application/octet-stream"): FILE,
                   (206, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the Range"),
                   304: NOT_MODIFIED, **errors(401, 403, 404, 413, 416, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = label_volume(request, kw)
        number = skeleton.SHARDS.shard_of_name(kw["shard"])
        fragments = services().fragments
        labels = [label for label in fragments.labels_in(volume) if skeleton.shard_of(label) == number]
        holding = {label: fragments.holding(volume, label) for label in labels}
        blobs = fragments_of(request, volume, sorted({key for keys in holding.values() for key in keys}))
        files = {label: skeleton.skeleton_of([blobs[k] for k in keys if k in blobs], label)
                 for label, keys in holding.items()}
        body = skeleton.skeleton_shard({label: file for label, file in files.items() if file is not None})
        return channel_file(chan, body, "application/octet-stream")


# Tails under /precomputed/{c}/{e}/{ch}/ and /precomputed-sharded/{c}/{e}/{ch}/, mounted by
# ndstore.api.urls before the chunk and shard routes (whose `{scale_key}/...` they would match).
ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("skeletons/info", InfoView),
    ("skeletons/<str:segment>", SkeletonView),
]
SHARDED_ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("skeletons/info", ShardedInfoView),
    ("skeletons/<shardname:shard>", ShardView),
]
