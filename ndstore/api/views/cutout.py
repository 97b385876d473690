"""Cutout endpoints: `/v1/cutout/...` (through the cache tier), `/v1/direct/cutout/...`
(straight to the base tier), `/v1/blaze/cutout/...` (into the NDBlaze write buffer). Bodies and
responses in every media type of ndstore.core.wire."""

from __future__ import annotations

from typing import Any

import numpy as np
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, lookups
from ndstore.api.converters import RangeConverter
from ndstore.api.errors import JSONErrors
from ndstore.api.media import ARRAY_PARSERS, ARRAY_RENDERERS, RAW_BODY_PARSERS, RawBody
from ndstore.core import wire
from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.geometry import Box
from ndstore.core.labels import keep_ids
from ndstore.engine.volume import Cutout, make_cutout
from ndstore.wiring import services

ACCESS_MODES = ("cache", "no_cache", "raw")

# OpenAPI descriptions of the cutout routes: binary bodies in each media type of ndstore.core.wire,
# the ranges' syntax, and the JSON that every refusal carries.
ERROR = inline_serializer("Error", {"status": serializers.IntegerField(), "message": serializers.CharField()})
ERROR_MEANINGS = {
    400: "bad range, resolution, time, query, or a body that does not decode to the box",
    401: "malformed or unknown token", 403: "no permission on the channel", 404: "no such resource",
    406: "unsupported Accept", 409: "conflicts with the resource's state",
    413: "body over NDSTORE_MAX_BODY_BYTES or box over NDSTORE_MAX_CUTOUT_BYTES",
    415: "unsupported Content-Type", 503: "storage or lock unavailable; retry after Retry-After",
}
BINARY_BODIES = {media: OpenApiTypes.BINARY for media in wire.FORMATS}
RANGE_DOC = "half-open {0}0:{0}1 in voxels of the level, e.g. 0:512"
CUTOUT_PARAMETERS = [
    *[OpenApiParameter(axis, str, OpenApiParameter.PATH, required=True, pattern=f"^{RangeConverter.regex}$",
                       description=RANGE_DOC.format(axis)) for axis in "xyz"],
    OpenApiParameter("resolution", {"type": "integer", "minimum": 0}, OpenApiParameter.PATH, required=True,
                     description="resolution level, 0 the finest"),
]


def error_responses(*codes: int) -> dict[tuple[int, str], OpenApiResponse]:
    """JSON `{"status", "message"}` for each refusal code, whatever the media type asked for."""
    return {(code, "application/json"): OpenApiResponse(ERROR, description=ERROR_MEANINGS[code]) for code in codes}


CUTOUT_READ = extend_schema(
    summary="Read a box",
    description="The box as a C-order (z, y, x) array, (t, z, y, x) with a time range, in the media type of "
                "`Accept` or `?format=` (application/blosc when the client accepts anything).",
    parameters=[
        *CUTOUT_PARAMETERS,
        OpenApiParameter("access-mode", str, enum=["cache", "no_cache", "no-cache", "raw"],
                         description="cache (default), no_cache (base tier after writing back dirty cached data) "
                                     "or raw (the base tier as it is)"),
        OpenApiParameter("filter", str, pattern=r"^\d+(,\d+)*$",
                         description="annotation channels: comma-separated label ids to keep; others read as 0"),
    ],
    responses={**{(200, media): OpenApiResponse(OpenApiTypes.BINARY, description=f"the box as {media}")
                  for media in wire.FORMATS},
               **error_responses(400, 401, 403, 404, 406, 413, 503)},
)
def write_schema(summary: str, description: str, created: str) -> Any:
    """The OpenAPI description of a cutout write: a binary body in any media type of ndstore.core.wire."""
    return extend_schema(summary=summary, description=description, parameters=CUTOUT_PARAMETERS,
                         request=BINARY_BODIES,
                         responses={201: OpenApiResponse(None, description=created),
                                    **error_responses(400, 401, 403, 404, 413, 415, 503)})


CUTOUT_WRITE = write_schema(
    "Write a box",
    "The body holds the whole box, C-order (z, y, x) or (t, z, y, x), in the channel's datatype, "
    "encoded as its Content-Type says. Refused bodies change nothing.",
    "stored; empty body")


class CutoutView(JSONErrors, APIView):
    tier = "cache"
    parser_classes = ARRAY_PARSERS
    renderer_classes = ARRAY_RENDERERS

    cutout: Cutout
    has_time: bool

    def max_body_bytes(self) -> int:
        return services().config.max_body_bytes

    def body_spec(self) -> tuple[tuple[int, ...], np.dtype]:
        shape = self.cutout.shape if self.has_time else self.cutout.shape[1:]
        return shape, self.cutout.channel.dtype

    def _resolve(self, request: Any, level: int, kw: dict[str, Any]) -> Any:
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

    @CUTOUT_READ
    def get(self, request: Any, **kw: Any) -> Response:
        chan = self._resolve(request, auth.READ, kw)
        asked = request.query_params.get("access-mode", "cache")
        mode = asked.replace("-", "_")  # intern sends no_cache as "no-cache"
        if mode not in ACCESS_MODES:
            raise InvalidRequest(f"access-mode must be one of {', '.join(ACCESS_MODES)}, not {asked!r}")
        data = services().tier(self.tier, mode).read(self.cutout)
        ids = _filter_ids(request.query_params.get("filter"), chan.type, self.cutout.channel.dtype)
        if ids is not None:
            data = keep_ids(data, ids)
        return Response(data if self.has_time else data[0])

    @CUTOUT_WRITE
    def post(self, request: Any, **kw: Any) -> Response:
        self._resolve(request, auth.WRITE, kw)
        data = request.data
        if not isinstance(data, np.ndarray):
            raise InvalidBody("request body is empty")
        services().tier(self.tier, "cache").write(self.cutout, data.reshape(self.cutout.shape))
        return Response(status=201)


class DirectCutoutView(CutoutView):
    tier = "direct"


class BlazeCutoutView(CutoutView):
    """Writes are stored as they arrived (framing checked, never decoded) and acknowledged with
    their sequence number; reads return the base tier plus every pending write, in order."""

    tier = "blaze"
    parser_classes = RAW_BODY_PARSERS

    @write_schema(
        "Buffer a write in NDBlaze",
        "Stored as it arrived (its framing checked against the box, not decoded); answers with "
        "the write's place in the total order of NDBlaze writes.",
        "buffered; X-NDBlaze-Sequence: <n>")
    def post(self, request: Any, **kw: Any) -> Response:
        self._resolve(request, auth.WRITE, kw)
        raw = request.data
        if not isinstance(raw, RawBody):
            raise InvalidBody("request body is empty")
        seq = services().blaze.write_body(self.cutout, raw.body, raw.media_type, self.has_time)
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


@extend_schema(responses=error_responses(400))
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
