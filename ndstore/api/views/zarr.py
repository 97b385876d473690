"""Zarr v3 + OME-Zarr 0.5, read-only and live: `/zarr/{c}/{e}/{ch}/zarr.json` (the multiscale
group), `.../{level}/zarr.json` (one array per advertised level) and `.../{level}/c/{t}/{z}/{y}/{x}`
(a chunk, read through the cache tier when asked for). zarr-python 3, TensorStore's zarr3 driver,
napari/ome-zarr and Neuroglancer's `zarr3://` read it. The layout is ndstore.core.zarr_view's;
CORS, ETag, Range and HEAD are ndstore.api.browser_http's; permissions those of the cutouts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response

from ndstore.api import auth, budget, levels, lookups
from ndstore.api.models import Channel
from ndstore.api.schema import errors
from ndstore.api.views.precomputed import NOT_MODIFIED, PrecomputedView, channel_file, voxel_nm_of
from ndstore.core import zarr_view
from ndstore.core.chunks import compress_cuboid, is_blosc1
from ndstore.core.errors import NotFound
from ndstore.engine.volume import ChannelVolume, Cutout, make_cutout
from ndstore.wiring import services

MEANINGS = {404: "no such collection, experiment, channel, level (only levels that hold data are arrays) or "
                 "chunk; a chunk whose voxels are all 0 (the fill value)",
            413: "the chunk is over NDSTORE_MAX_CUTOUT_BYTES"}


def _channel(request: Any, kw: dict[str, Any]) -> tuple[Channel, ChannelVolume]:
    coll, exp, chan = lookups.channel_path(kw["collection"], kw["experiment"], kw["channel"])
    auth.require(request.user, auth.READ, coll, exp, chan)
    return chan, lookups.channel_volume(chan)


def _level(chan: Channel, volume: ChannelVolume, level: int) -> int:
    built = levels.built_levels(chan, volume)
    if level not in built:
        raise NotFound(f"no array {level}: this channel's arrays are its levels that hold data, "
                       f"{', '.join(map(str, built))}")
    return level


def _json(chan: Channel, body: dict[str, Any]) -> HttpResponse:
    return channel_file(chan, json.dumps(body).encode(), "application/json")


def _image_label(chan: Channel, image: str | None) -> dict[str, Any] | None:
    """An annotation channel's `image-label` metadata: its source image, by a path relative to
    its group (`image`), or its first source channel beside it."""
    if chan.type != "annotation":
        return None
    if image is None and chan.sources:
        image = f"../{chan.sources[0]}"
    return {"source": {"image": image}} if image else {}


def _group(chan: Channel, volume: ChannelVolume, image: str | None = None) -> HttpResponse:
    built = levels.built_levels(chan, volume)
    return _json(chan, zarr_view.group(volume, chan.name, voxel_nm_of(chan), built, volume.num_time_samples,
                                       _image_label(chan, image)))


class GroupView(PrecomputedView):
    @extend_schema(summary="The channel as an OME-Zarr multiscale group (zarr.json)",
                   description="An annotation channel's group carries OME-Zarr's `image-label` metadata.",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 group metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        return _group(*_channel(request, kw))


def _labels_of(request: Any, image: Channel) -> list[Channel]:
    """The annotation channels of the image's experiment that name it a source and the caller
    may read: its labels."""
    exp = image.experiment
    return [c for c in exp.channels.filter(type="annotation").order_by("name")
            if image.name in (c.sources or []) and auth.access_level(request.user, exp.collection, exp, c) >= auth.READ]


def _label(request: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """The route's words with `channel` the label's, once the caller may read the image and the
    label and the label names the image a source (else a 404 as for any missing file)."""
    image, _ = _channel(request, kw)
    as_label = {**kw, "channel": kw["label"]}
    label, _ = _channel(request, as_label)
    if label.type != "annotation" or image.name not in (label.sources or []):
        raise NotFound(f"no label image {kw['label']!r} of {image.name}: its labels are the annotation channels "
                       "that name it a source")
    return as_label


class LabelsView(PrecomputedView):
    @extend_schema(summary="An image's labels/ group: its annotation channels",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 group metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        image, _ = _channel(request, kw)
        return _json(image, zarr_view.labels_group([c.name for c in _labels_of(request, image)]))


class LabelGroupView(PrecomputedView):
    @extend_schema(summary="A label image under its image's labels/ (the annotation channel's group)",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 group metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        return _group(*_channel(request, _label(request, kw)), image="../../")


class ArrayView(PrecomputedView):
    @extend_schema(summary="One level as a Zarr v3 array (zarr.json)",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 array metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = _channel(request, kw)
        level = _level(chan, volume, kw["level"])
        return _json(chan, zarr_view.array(volume, level, volume.num_time_samples))


class ChunkView(PrecomputedView):
    @extend_schema(summary="One Zarr chunk: c/{t}/{z}/{y}/{x}",
                   description="Voxels of (1, cuboid z, y, x), little endian, C order, in a c-blosc frame (the "
                               "array's codecs: bytes, blosc); past the level's extent filled with 0. On a level "
                               "whose extent starts on a cuboid boundary a chunk is a stored cuboid, sent as it is "
                               "stored. A chunk whose voxels are all 0 (never written, or written as 0: the store "
                               "keeps neither) is a 404, which zarr readers read as fill_value 0.",
                   responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 413, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = _channel(request, kw)
        level = _level(chan, volume, kw["level"])
        index = (kw["t"], kw["z"], kw["y"], kw["x"])
        t, box, whole = zarr_view.chunk_box(volume, level, volume.num_time_samples, index)
        cutout = make_cutout(volume, level, box, range(t, t + 1), services().config.max_cutout_bytes)
        # the read and the padded chunk
        chunk_bytes = math.prod(whole) * volume.dtype.itemsize
        budget.reserve(request, 2 * chunk_bytes, cutout, reading=chunk_bytes)
        return channel_file(chan, chunk_file(volume, level, cutout, whole, index), "application/octet-stream")


def chunk_file(volume: ChannelVolume, level: int, cutout: Cutout, whole: tuple[int, int, int],
               index: tuple[int, int, int, int]) -> bytes:
    """The chunk's file: on a level whose chunks are its cuboids, the stored cuboid as it is (one
    lock-free snapshot, no decode, no encode); otherwise, or when the cache tier or NDBlaze's
    pending writes say the stored blob is not the live state, the voxels read and compressed as
    a cuboid is stored."""
    if zarr_view.on_cuboid_grid(volume, level):
        blob = services().plane.stored(cutout)
        if blob == b"":
            raise _fill_value(index)
        if blob is not None and is_blosc1(blob):
            return blob
    data = services().plane.read(cutout)[0]
    if not data.any():
        raise _fill_value(index)
    chunk = np.zeros(whole, volume.dtype.newbyteorder("<"))
    chunk[tuple(slice(0, n) for n in data.shape)] = data
    return compress_cuboid(chunk)


def _fill_value(index: tuple[int, int, int, int]) -> NotFound:
    return NotFound(f"chunk c/{'/'.join(map(str, index))} holds only the fill value: every voxel is 0 (the store "
                    "keeps no all-zero cuboid; zarr readers read a missing chunk as fill_value 0)")


@extend_schema(summary="Any other file under /zarr/", responses=errors(401, 404, 429, meanings={
    404: "no such file; the message lists the files a channel has"}))
class NoSuchFile(PrecomputedView):
    """`.zgroup`, `.zattrs` (zarr v2 probes), consolidated metadata, anything else: a 404 that says
    what exists (a zarr reader takes a 404 for "not this format" or "not there")."""

    def get(self, request: Any, **kw: Any) -> Response:
        raise NotFound(f"no such zarr file: {kw.get('rest', '')!r}; a channel has /zarr/{{collection}}/"
                       "{experiment}/{channel}/zarr.json (an OME-Zarr 0.5 group), {level}/zarr.json (one "
                       "array per level that holds data) and {level}/c/{t}/{z}/{y}/{x} (chunks)")


class LabelArrayView(ArrayView):
    @extend_schema(summary="One level of a label image under labels/ (zarr.json)",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 array metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        return super().read(request, _label(request, kw))


class LabelChunkView(ChunkView):
    @extend_schema(summary="One chunk of a label image under labels/",
                   responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 413, 429, 500, 503, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        return super().read(request, _label(request, kw))


LABEL = "labels/<name:label>/"
ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("zarr.json", GroupView),
    ("<int:level>/zarr.json", ArrayView),
    ("<int:level>/c/<int:t>/<int:z>/<int:y>/<int:x>", ChunkView),
    ("labels/zarr.json", LabelsView),
    (f"{LABEL}zarr.json", LabelGroupView),
    (f"{LABEL}<int:level>/zarr.json", LabelArrayView),
    (f"{LABEL}<int:level>/c/<int:t>/<int:z>/<int:y>/<int:x>", LabelChunkView),
]
