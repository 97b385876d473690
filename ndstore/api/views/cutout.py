"""Cutout endpoints: `/v1/cutout/...` (through the cache tier), `/v1/direct/cutout/...`
(straight to the base tier), `/v1/blaze/cutout/...` (into the NDBlaze write buffer). Bodies and
responses in every media type of ndstore.core.wire."""

from __future__ import annotations

from typing import Any

import numpy as np
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, lookups
from ndstore.api.errors import JSONErrors
from ndstore.api.media import ARRAY_PARSERS, ARRAY_RENDERERS, RAW_BODY_PARSERS, RawBody
from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.geometry import Box
from ndstore.core.labels import keep_ids
from ndstore.engine.volume import Cutout, make_cutout
from ndstore.wiring import services

ACCESS_MODES = ("cache", "no_cache", "raw")


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

    def get(self, request: Any, **kw: Any) -> Response:
        chan = self._resolve(request, auth.READ, kw)
        asked = request.query_params.get("access-mode", "cache")
        mode = asked.replace("-", "_")  # intern sends no_cache as "no-cache"
        if mode not in ACCESS_MODES:
            raise InvalidRequest(f"access-mode must be one of {', '.join(ACCESS_MODES)}, not {asked!r}")
        data = services().tier(self.tier, mode).read(self.cutout)
        ids = _filter_ids(request.query_params.get("filter"), chan.type)
        if ids is not None:
            data = keep_ids(data, ids)
        return Response(data if self.has_time else data[0])

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

    def post(self, request: Any, **kw: Any) -> Response:
        self._resolve(request, auth.WRITE, kw)
        raw = request.data
        if not isinstance(raw, RawBody):
            raise InvalidBody("request body is empty")
        seq = services().blaze.write_body(self.cutout, raw.body, raw.media_type, self.has_time)
        return Response(status=201, headers={"X-NDBlaze-Sequence": str(seq)})


def _filter_ids(raw: str | None, channel_type: str) -> list[int] | None:
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
    return ids


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
