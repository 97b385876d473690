"""Meshes of a label channel, read-only and live, in Neuroglancer's `neuroglancer_multilod_draco`
format: `/precomputed/{c}/{e}/{ch}/mesh/info`, `.../mesh/{segment}.index` (the manifest) and
`.../mesh/{segment}` (the fragment data, read by Range), and under `/precomputed-sharded/` the
same `mesh/info` declaring `neuroglancer_uint64_sharded_v1` and `.../mesh/{shard}.shard`.

Each answer is computed when asked for from the stored fragment objects of the supercuboids that
hold the segment (services().fragments, ndstore.core.segments.mesh): meshes are of level 0 at the
channel's default_time_sample. A Range of a fragment data file or a shard is a slice of the whole
(ndstore.api.browser_http): a segment's data is its fragments, a shard holds few segments (the
label's low 16 bits name it). Permissions, CORS and ETags are those of the other precomputed files.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema

from ndstore.api import budget
from ndstore.api.models import Channel
from ndstore.api.schema import errors
from ndstore.api.views.precomputed import NOT_MODIFIED, PrecomputedView, channel_file, channel_for, voxel_nm_of
from ndstore.core.errors import InvalidRequest, NotFound
from ndstore.core.keys import VolumeKey
from ndstore.core.segments import mesh
from ndstore.engine.volume import ChannelVolume
from ndstore.wiring import services

OCTET = "application/octet-stream"
MEANINGS = {
    400: "the segment id is not a decimal integer in 1 .. 2^64 - 1",
    404: "no such collection, experiment or channel; not a label channel; no mesh of that segment (yet); no such "
         "shard",
    416: "the range starts past the end",
    503: "the label index does not serve this channel yet, or storage is unavailable",
}
BINARY = OpenApiResponse(OpenApiTypes.BINARY)


def label_volume(request: Any, kw: dict[str, Any]) -> tuple[Channel, ChannelVolume]:
    """The channel (read permission checked) and its volume; 404 unless it holds labels."""
    chan, volume, _ = channel_for(request, kw)
    if not volume.annotation:
        raise NotFound(f"channel {chan.name!r} is an image channel: meshes are of annotation (label) channels")
    return chan, volume


def segment_id(text: str) -> int:
    """A segment id as Neuroglancer writes it: base-10, 1 .. 2^64 - 1 (0 is the background)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise InvalidRequest(f"segment id {text[:40]!r} is not a decimal integer")
    label = int(text)
    if not 0 < label < 1 << 64:
        raise InvalidRequest(f"segment id {label} is out of range: segments are 1 .. 2^64 - 1 (0 is the background)")
    return label


def products_key(chan: Channel, volume: ChannelVolume) -> VolumeKey:
    """Products are those of level 0 at the channel's default time sample."""
    return volume.volume_key(0, chan.default_time_sample)


def built_segment(request: Any, key: VolumeKey, label: int) -> tuple[bytes, bytes] | None:
    """The segment's manifest and fragment data, from its supercuboids' fragment objects."""
    blobs = services().fragments.of_label("mesh", key, label)
    held = sum(len(b) for b in blobs.values())
    budget.reserve(request, held, None, reading=held)
    return mesh.segment_manifest([mesh.label_pieces(blob, label) for blob in blobs.values()])


def segment_or_404(request: Any, kw: dict[str, Any]) -> tuple[Channel, tuple[bytes, bytes]]:
    chan, volume = label_volume(request, kw)
    label = segment_id(kw["segment"])
    built = built_segment(request, products_key(chan, volume), label)
    if built is None:
        raise NotFound(f"segment {label} has no mesh: no voxel holds it, or its meshes are not built yet")
    return chan, built


class InfoView(PrecomputedView):
    sharded = False

    @extend_schema(summary="A label channel's mesh info (neuroglancer_multilod_draco)", responses={
        200: OpenApiTypes.OBJECT, 304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, _ = label_volume(request, kw)
        body = mesh.mesh_info(voxel_nm_of(chan), sharded=self.sharded)
        return channel_file(chan, json.dumps(body).encode(), "application/json")


class ShardedInfoView(InfoView):
    sharded = True


class ManifestView(PrecomputedView):
    @extend_schema(summary="A segment's mesh manifest", responses={
        (200, OCTET): BINARY, 304: NOT_MODIFIED, **errors(400, 401, 403, 404, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, (manifest, _) = segment_or_404(request, kw)
        return channel_file(chan, manifest, OCTET)


class FragmentsView(PrecomputedView):
    @extend_schema(summary="A segment's mesh fragment data",
                   description="Draco fragments in the manifest's order; read a byte Range of it.",
                   responses={(200, OCTET): BINARY, (206, OCTET): BINARY, 304: NOT_MODIFIED,
                              **errors(400, 401, 403, 404, 416, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, (_, data) = segment_or_404(request, kw)
        return channel_file(chan, data, OCTET)


class ShardView(PrecomputedView):
    @extend_schema(summary="A shard of segments' meshes (neuroglancer_uint64_sharded_v1)",
                   description="Read byte Ranges of it: the shard index, the minishard index, a manifest and the "
                               "fragment data just before it.",
                   responses={(200, OCTET): BINARY, (206, OCTET): BINARY, 304: NOT_MODIFIED,
                              **errors(401, 403, 404, 416, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = label_volume(request, kw)
        number = shard_number(kw["shard"])
        key = products_key(chan, volume)
        segments = []
        for label in sorted(services().fragments.labels_in(key)):
            if mesh.shard_of(label) == number:
                built = built_segment(request, key, label)
                if built is not None:
                    segments.append((label, *built))
        return channel_file(chan, mesh.shard_file(segments), OCTET)


def shard_number(name: str) -> int:
    digits = name.removesuffix(".shard")
    width = len(mesh.shard_name(0)) - len(".shard")
    if digits == name or len(digits) != width or not all(c in "0123456789abcdef" for c in digits):
        raise NotFound(f"no mesh shard {name[:40]!r}: shards are {mesh.shard_name(0)} .. "
                       f"{mesh.shard_name((1 << mesh.SHARD_BITS) - 1)}")
    return int(digits, 16)


# Tails under /precomputed/{c}/{e}/{ch}/ and /precomputed-sharded/{c}/{e}/{ch}/, mounted by
# ndstore.api.urls ahead of those modules' own (whose `{scale_key}/...` would take `mesh/...`).
ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("mesh/info", InfoView),
    ("mesh/<str:segment>.index", ManifestView),
    ("mesh/<str:segment>", FragmentsView),
]
SHARDED_ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("mesh/info", ShardedInfoView),
    ("mesh/<str:shard>", ShardView),
]
