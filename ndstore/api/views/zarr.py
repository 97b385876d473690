"""Zarr v3 + OME-Zarr 0.5, read-only and live: `/zarr/{c}/{e}/{ch}/zarr.json` (the multiscale
group), `.../{level}/zarr.json` (one array per advertised level) and `.../{level}/c/{t}/{z}/{y}/{x}`
(a chunk, read through the cache tier when asked for). zarr-python 3, TensorStore's zarr3 driver,
napari/ome-zarr and Neuroglancer's `zarr3://` read it. The layout is ndstore.core.zarr_view's;
CORS, ETag, Range and HEAD are ndstore.api.browser_http's; permissions those of the cutouts.
"""

from __future__ import annotations

import json
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
from ndstore.core.errors import NotFound
from ndstore.engine.volume import ChannelVolume, make_cutout
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


class GroupView(PrecomputedView):
    @extend_schema(summary="The channel as an OME-Zarr multiscale group (zarr.json)",
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="Zarr v3 group metadata"),
                              304: NOT_MODIFIED, **errors(401, 403, 404, 429, meanings=MEANINGS)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume = _channel(request, kw)
        built = levels.built_levels(chan, volume)
        return _json(chan, zarr_view.group(volume, chan.name, voxel_nm_of(chan), built, volume.num_time_samples))


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
                   description="Little-endian voxels of (1, cuboid z, y, x), C order, read through the cache tier; "
                               "past the level's extent filled with 0. A chunk whose voxels are all 0 (never "
                               "written, or written as 0: the store keeps neither) is a 404, which zarr readers "
                               "read as fill_value 0.",
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
        chunk_bytes = int(np.prod(whole)) * volume.dtype.itemsize
        budget.reserve(request, 2 * chunk_bytes, cutout, reading=chunk_bytes)
        data = services().plane.read(cutout)[0]
        if not data.any():
            raise NotFound(f"chunk c/{'/'.join(map(str, index))} holds only the fill value: every voxel is 0 "
                           "(the store keeps no all-zero cuboid; zarr readers read a missing chunk as fill_value 0)")
        chunk = np.zeros(whole, volume.dtype.newbyteorder("<"))
        chunk[tuple(slice(0, n) for n in data.shape)] = data
        return channel_file(chan, chunk.tobytes(), "application/octet-stream")


@extend_schema(summary="Any other file under /zarr/", responses=errors(401, 404, 429, meanings={
    404: "no such file; the message lists the files a channel has"}))
class NoSuchFile(PrecomputedView):
    """`.zgroup`, `.zattrs` (zarr v2 probes), consolidated metadata, anything else: a 404 that says
    what exists (a zarr reader takes a 404 for "not this format" or "not there")."""

    def get(self, request: Any, **kw: Any) -> Response:
        raise NotFound(f"no such zarr file: {kw.get('rest', '')!r}; a channel has /zarr/{{collection}}/"
                       "{experiment}/{channel}/zarr.json (an OME-Zarr 0.5 group), {level}/zarr.json (one "
                       "array per level that holds data) and {level}/c/{t}/{z}/{y}/{x} (chunks)")


ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("zarr.json", GroupView),
    ("<int:level>/zarr.json", ArrayView),
    ("<int:level>/c/<int:t>/<int:z>/<int:y>/<int:x>", ChunkView),
]
