"""Cutout endpoints: `/v1/cutout/...` (through the cache tier), `/v1/direct/cutout/...`
(straight to the base tier), `/v1/blaze/cutout/...` (into the NDBlaze write buffer). Bodies and
responses in every media type of ndstore.core.wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, budget, lookups
from ndstore.api.errors import JSONErrors
from ndstore.api.media import (
    ARRAY_PARSERS,
    CUTOUT_RENDERERS,
    RAW_BODY_PARSERS,
    CutoutImageRenderer,
    RawBody,
)
from ndstore.api.schema import binary, binary_responses, errors
from ndstore.core import wire
from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.geometry import Box
from ndstore.core.labels import keep_ids
from ndstore.engine.dataplane import Read, Write
from ndstore.engine.volume import Cutout, make_cutout
from ndstore.wiring import services

ACCESS_MODES = {mode.value: mode for mode in (Read.LIVE, Read.BASE, Read.RAW)}  # ?access-mode=

# What the refusals of the cutout routes mean, where a cutout says more than MEANINGS.
REFUSALS = {
    400: "bad range, resolution, time, query, or a body that does not decode to the box",
    403: "no permission on the channel", 404: "no such collection, experiment or channel",
    413: "the box is over NDSTORE_MAX_CUTOUT_BYTES",
}
BODY_TOO_LARGE = {413: "the body is over NDSTORE_MAX_BODY_BYTES, or the box over NDSTORE_MAX_CUTOUT_BYTES"}


def refusals(*codes: int, meanings: dict[int, str] | None = None) -> dict[tuple[int, str], OpenApiResponse]:
    return errors(*codes, meanings={**REFUSALS, **(meanings or {})})


def read_schema(description: str, modes: str) -> Any:
    """The OpenAPI description of a cutout read on one path: the box in any media type of ndstore.core.wire."""
    return extend_schema(
        summary="Read a box",
        description=f"{description} The box is a C-order (z, y, x) array, (t, z, y, x) with a time range, in the "
                    "media type of `Accept` or `?format=` (application/blosc when the client accepts anything).",
        parameters=[
            OpenApiParameter("format", str, enum=[renderer.format for renderer in CUTOUT_RENDERERS],
                             description="the media type's subtype, instead of Accept"),
            OpenApiParameter("access-mode", str, enum=["cache", "no_cache", "no-cache", "raw"], description=modes),
            OpenApiParameter("filter", str, pattern=r"^\d+(,\d+)*$",
                             description="annotation channels: comma-separated label ids to keep; others read as 0"),
        ],
        responses={**binary_responses(200, [r.media_type for r in CUTOUT_RENDERERS],
                                      "the box; image/jpeg (uint8) and image/png (uint8, uint16): one greyscale "
                                      "image, the box's (z, y) rows stacked, x across"),
                   **refusals(400, 401, 403, 404, 406, 413, 429, 500, 503)})


def write_schema(summary: str, description: str, created: str, *codes: int) -> Any:
    """The OpenAPI description of a cutout write: a binary body in any media type of ndstore.core.wire."""
    return extend_schema(
        summary=summary,
        description=f"{description} The body holds the whole box, C-order (z, y, x) or (t, z, y, x), in the "
                    "channel's datatype, encoded as its Content-Type says; a refused body changes nothing.",
        request=binary(wire.FORMATS),
        responses={201: OpenApiResponse(None, description=created), **refusals(*codes, meanings=BODY_TOO_LARGE)})


class CutoutView(JSONErrors, APIView):
    writes_to = Write.CACHE
    reads_from = {Read.LIVE: Read.LIVE, Read.BASE: Read.BASE, Read.RAW: Read.RAW}  # ?access-mode= -> the read
    writes_supercuboids = True  # a write merges into supercuboids (the budget counts them)
    parser_classes = ARRAY_PARSERS
    renderer_classes = CUTOUT_RENDERERS

    cutout: Cutout
    has_time: bool

    def max_body_bytes(self) -> int:
        """The largest body of this box in any media type (its raw bytes, plus what framing and an
        incompressible body's compression can add), within NDSTORE_MAX_BODY_BYTES."""
        return min(services().config.max_body_bytes, wire.encoded_bound(self.cutout.nbytes))

    def body_limit(self, request: Any, kw: dict[str, Any]) -> int:
        """What the front may read of a write's body (ndstore/api/admission.py): the caller's
        write grant on the channel and the box are checked first, as the write checks them."""
        self._target(request, auth.WRITE, kw)
        return self.max_body_bytes()

    def body_spec(self) -> tuple[tuple[int, ...], np.dtype]:
        shape = self.cutout.shape if self.has_time else self.cutout.shape[1:]
        return shape, self.cutout.channel.dtype

    def _target(self, request: Any, level: int, kw: dict[str, Any]) -> Any:
        """The channel, with the caller's access to it checked, and the cutout of the URL."""
        coll, exp, chan = lookups.channel_path(kw["collection"], kw["experiment"], kw["channel"])
        auth.require(request.user, level, coll, exp, chan)
        box = Box.from_ranges(kw["x"], kw["y"], kw["z"])
        t = kw.get("t")
        self.has_time = t is not None
        times = range(*t) if t is not None else range(chan.default_time_sample, chan.default_time_sample + 1)
        self.cutout = make_cutout(
            lookups.channel_volume(chan), kw["resolution"], box, times, services().config.max_cutout_bytes
        )
        return chan

    def _resolve(self, request: Any, level: int, kw: dict[str, Any]) -> Any:
        chan = self._target(request, level, kw)
        renderer = getattr(request, "accepted_renderer", None)
        if level == auth.READ and isinstance(renderer, CutoutImageRenderer):
            renderer.check(self.cutout.channel.dtype, self.cutout.shape)  # before anything is reserved or read
        holds = budget.reads(request) or self.writes_supercuboids
        budget.reserve(request, self.cutout.nbytes, self.cutout if holds else None, reading=self.cutout.nbytes)
        return chan

    @read_schema("Through the cache tier, with the writes still pending in NDBlaze.",
                 "cache (default): through the cache; no_cache (or no-cache): the base tier, after writing back "
                 "dirty cached data; both with pending NDBlaze writes; raw: the base tier as it is")
    def get(self, request: Any, **kw: Any) -> Response:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> Response:
        """The read, for DRF's dispatch and the data routes' own (ndstore/api/data_routes.py):
        ``request`` is either's, with its caller authenticated."""
        chan = self._resolve(request, auth.READ, kw)
        asked = request.GET.get("access-mode", "cache")
        mode = ACCESS_MODES.get(asked.replace("-", "_"))  # intern sends no_cache as "no-cache"
        if mode is None:
            raise InvalidRequest(f"access-mode must be one of {', '.join(ACCESS_MODES)}, not {asked!r}")
        data = services().plane.read(self.cutout, self.reads_from[mode])
        ids = _filter_ids(request.GET.get("filter"), chan.type, self.cutout.channel.dtype)
        if ids is not None:
            data = keep_ids(data, ids)
        return Response(data if self.has_time else data[0])

    @write_schema("Write a box", "Through the cache tier: written back to the base tier by the flusher, or "
                  "before the answer for channels with cache_write_through.",
                  "stored; empty body", 400, 401, 403, 404, 413, 415, 503, 507)
    def post(self, request: Any, **kw: Any) -> Response:
        return self.write(request, kw, lambda: request.data)

    def write(self, request: Any, kw: dict[str, Any], body: Callable[[], Any]) -> Response:
        """The write, for both dispatches (as read): the caller may write the channel and the box
        is reserved before ``body()`` reads and decodes a byte of the body."""
        self._resolve(request, auth.WRITE, kw)
        data = body()
        if not isinstance(data, np.ndarray):
            raise InvalidBody("request body is empty")
        services().plane.write(self.cutout, data, self.writes_to)
        return Response(status=201)


@extend_schema_view(
    get=read_schema("Straight from the base tier, after writing back dirty cached data, with the writes still "
                    "pending in NDBlaze.",
                    "raw: the base tier as it is, without dirty cached data or pending NDBlaze writes; any other mode "
                    "reads as the default does"),
    post=write_schema("Write a box to the base tier", "Straight to the base tier; cached copies are dropped.",
                      "stored; empty body", 400, 401, 403, 404, 413, 415, 503, 507))
class DirectCutoutView(CutoutView):
    writes_to = Write.DIRECT
    reads_from = {Read.LIVE: Read.BASE, Read.BASE: Read.BASE, Read.RAW: Read.RAW}


@extend_schema_view(get=read_schema(
    "The base tier plus every pending NDBlaze write, in order.",
    "raw: the base tier as it is, without pending NDBlaze writes or dirty cached data; any other mode reads as the "
    "default does"))
class BlazeCutoutView(CutoutView):
    """Writes are stored as they arrived (framing checked, never decoded) and acknowledged with
    their sequence number; reads return the base tier plus every pending write, in order."""

    writes_to = Write.BUFFERED
    reads_from = {Read.LIVE: Read.BUFFERED, Read.BASE: Read.BUFFERED, Read.RAW: Read.RAW}
    parser_classes = RAW_BODY_PARSERS
    writes_supercuboids = False  # the body is buffered as it came; the merger applies it elsewhere

    @write_schema(
        "Buffer a write in NDBlaze",
        "Into the NDBlaze write buffer, as it arrived, after every check its decoding makes; the answer gives the "
        "write's place in the total order of NDBlaze writes, which a merge applies to the base tier. A full buffer "
        "answers 503, storing nothing.",
        "buffered; empty body, the header X-NDBlaze-Sequence: <n>", 400, 401, 403, 404, 413, 415, 503)
    def post(self, request: Any, **kw: Any) -> Response:
        return self.write(request, kw, lambda: request.data)

    def write(self, request: Any, kw: dict[str, Any], body: Callable[[], Any]) -> Response:
        self._resolve(request, auth.WRITE, kw)
        raw = body()
        if not isinstance(raw, RawBody):
            raise InvalidBody("request body is empty")
        seq = services().plane.buffer(self.cutout, raw.body, raw.media_type, self.has_time)
        return Response(status=201, headers={"X-NDBlaze-Sequence": str(seq)})


def _filter_ids(raw: str | None, channel_type: str, dtype: np.dtype) -> list[int] | None:
    if raw is None:
        return None
    if channel_type != "annotation":
        raise InvalidRequest("filter applies to annotation channels only")
    try:
        ids = [int(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise InvalidRequest(f"filter must be comma-separated integer ids, not {raw!r}") from None
    if any(i < 0 for i in ids):
        raise InvalidRequest("filter ids must not be negative")
    top = int(np.iinfo(dtype).max)
    too_big = [i for i in ids if i > top]
    if too_big:
        raise InvalidRequest(f"filter id {too_big[0]} is past the largest {dtype} label of this channel ({top})")
    return ids


@extend_schema(summary="Malformed cutout URL", description="A 400 showing the URL's shape.", request=None,
               responses=errors(400, 401))
class MalformedCutout(APIView):
    """Any other path under a cutout prefix: say what the URL must look like."""

    def dispatch_error(self) -> Response:
        raise InvalidRequest(
            "malformed cutout URL; expected .../cutout/{collection}/{experiment}/{channel}/{resolution}/"
            "{x0}:{x1}/{y0}:{y1}/{z0}:{z1}/[{t0}:{t1}/] with integer, half-open ranges"
        )

    def get(self, request: Any, **kw: Any) -> Response:
        return self.dispatch_error()

    def post(self, request: Any, **kw: Any) -> Response:
        return self.dispatch_error()
