"""Boss v1 routes that the `intern` client uses beyond resources and cutouts.

- the resource routes without their trailing slash (intern asks for `/v1/collection/{c}`, and
  lists collections at `/v1/collection//`);
- `PUT /v1/cutout/to_black/{c}/{e}/{ch}/{res}/{x}/{y}/{z}/[{t}/]`: zeros written through the cache tier;
- `GET /v1/ids/{c}/{e}/{ch}/{res}/{x}/{y}/{z}/[{t}/]`: the label ids in a box (annotation channels);
- `GET /v1/boundingbox/{c}/{e}/{ch}/{res}/{id}/?type=loose|tight`: where a label id occurs, found
  by reading the supercuboids the label index lists for it (docs/design/label-index.md);
- `GET /v1/reserve/{c}/{e}/{ch}/{count}`: a block of fresh annotation ids from a per-channel counter;
- `GET|POST|PUT|DELETE /v1/meta/{c}[/{e}[/{ch}]]/?key=&value=`: metadata key-value pairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpResponse
from django.urls import URLPattern, path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, budget, lookups
from ndstore.api.models import Channel, IdCounter, MetaValue
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.api.views import resources
from ndstore.api.views.cutout import CutoutView, refusals
from ndstore.core.errors import Conflict, InvalidRequest, NotFound
from ndstore.engine.volume import check_level
from ndstore.wiring import services

MAX_RESERVE = 1 << 32  # ids per reservation
MAX_ID = (1 << 63) - 1  # the counter is a signed 64-bit column
MAX_META_KEY = 128
MAX_META_VALUE = 64 << 10
BOX = "<name:collection>/<name:experiment>/<name:channel>/<int:resolution>/<range:x>/<range:y>/<range:z>/"
CHANNEL = "<name:collection>/<name:experiment>/<name:channel>"

NOT_ANNOTATION = {400: "bad URL or query, or the channel is not an annotation channel"}
SPAN = serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2,
                             help_text="half-open [start, stop]")
META_KEY = OpenApiParameter("key", str, required=True, description=f"the metadata key, at most {MAX_META_KEY} "
                                                                    "characters")
META_VALUE = OpenApiParameter("value", str, required=True, description=f"the value, at most {MAX_META_VALUE} "
                                                                        "characters")
META_PAIR = inline_serializer("MetaValue", {"key": serializers.CharField(), "value": serializers.CharField()})


def _require_annotation(chan: Channel, action: str) -> None:
    if chan.type != "annotation":
        raise InvalidRequest(f"{action} applies to annotation channels only; {chan.name} is an {chan.type} channel")


class ToBlackView(CutoutView):
    """Zero a box (Boss `cutout/to_black`), through the cache tier like any cutout write."""

    http_method_names = ["put", "options"]
    renderer_classes = [JSONRenderer]

    @extend_schema(summary="Zero a box", description="Writes zeros over the box, through the cache tier.",
                   request=None, responses={200: OpenApiResponse(None, description="zeroed; empty body"),
                                            **refusals(400, 401, 403, 404, 413, 503, 507)})
    def put(self, request: Any, **kw: Any) -> Response:
        self._resolve(request, auth.WRITE, kw)
        services().plane.write(self.cutout, np.zeros(self.cutout.shape, self.cutout.channel.dtype))
        return Response(status=200)


class IdsView(CutoutView):
    """The non-zero label ids in a box, as decimal strings (Boss shape: `{"ids": ["1", "7"]}`)."""

    http_method_names = ["get", "head", "options"]
    renderer_classes = [JSONRenderer]

    @extend_schema(
        summary="The label ids in a box",
        responses={200: inline_serializer("Ids", {"ids": serializers.ListField(
                       child=serializers.CharField(), help_text="non-zero label ids, ascending, as decimal strings")}),
                   **refusals(400, 401, 403, 404, 413, 429, 500, 503, meanings=NOT_ANNOTATION)})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        chan = self._resolve(request, auth.READ, kw)
        _require_annotation(chan, "ids")
        # np.unique's sorted copy and the JSON text (the read was charged with the cutout's reservation)
        budget.reserve(request, self.cutout.nbytes // 2, None, reading=0)
        return HttpResponse(ids_json(services().plane.ids(self.cutout)), content_type="application/json")


def ids_json(ids: npt.NDArray[Any], batch: int = 1 << 20) -> bytes:
    """`{"ids": ["1", "7"]}` without a Python object per id (a box of distinct uint64 labels has
    one id per voxel: a list of str would take ~8x the box)."""
    parts = [b'{"ids": [']
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch].tolist()
        parts.append((", " if start else "").encode() + ", ".join(f'"{i}"' for i in chunk).encode())
    parts.append(b"]}")
    return b"".join(parts)


class BoundingBoxView(APIView):
    @extend_schema(
        summary="Where a label occurs",
        description="The bounds of a label id at a resolution level, over all time samples, found by reading "
                    "the supercuboids the channel's label index lists for it. An id beyond the channel's "
                    "datatype occurs nowhere (404).",
        parameters=[OpenApiParameter("label", OpenApiTypes.INT, OpenApiParameter.PATH, description="the label id"),
                    OpenApiParameter("type", str, enum=["loose", "tight"], default="loose",
                                     description="loose widens the box to cuboid boundaries (clipped to the frame)")],
        responses={200: inline_serializer("BoundingBox", {f"{axis}_range": SPAN for axis in "xyzt"}),
                   **errors(400, 401, 403, 404, 429, 500, 503, meanings={
                       **NOT_ANNOTATION, 404: "no such resource, or the id occurs nowhere at this level"})})
    def get(self, request: Any, collection: str, experiment: str, channel: str, resolution: int,
            label: int) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.READ, coll, exp, chan)
        _require_annotation(chan, "boundingbox")
        kind = request.query_params.get("type", "loose")
        if kind not in ("loose", "tight"):
            raise InvalidRequest(f"type must be loose or tight, not {kind!r}")
        volume = lookups.channel_volume(chan)
        check_level(volume, resolution)
        if label == 0:
            raise InvalidRequest("id 0 is the background, not an object")
        found = services().plane.bounding_box(volume, resolution, label, kind == "loose")
        if found is None:
            raise NotFound(f"id {label} does not occur in {collection}/{experiment}/{channel} at resolution "
                           f"{resolution}")
        return Response(found)


def reserve(chan: Channel, count: int) -> int:
    """Advance the channel's id counter by `count`; return the first id of the block."""
    limit = min(int(np.iinfo(np.dtype(chan.datatype)).max), MAX_ID)
    with transaction.atomic():
        IdCounter.objects.get_or_create(channel=chan)
        moved = (IdCounter.objects.filter(channel=chan, next_id__lte=limit - count + 1)
                 .update(next_id=F("next_id") + count))
        if not moved:
            raise Conflict(f"fewer than {count} unreserved ids are left in {chan.name} ({chan.datatype})")
        return int(IdCounter.objects.values_list("next_id", flat=True).get(channel=chan)) - count


class ReserveView(APIView):
    @extend_schema(
        summary="Reserve label ids",
        description="A block of fresh ids from the channel's counter, starting at 1 (annotation channels; write "
                    "permission).",
        parameters=[OpenApiParameter("count", OpenApiTypes.INT, OpenApiParameter.PATH,
                                     description=f"how many ids, 1..{MAX_RESERVE}")],
        auth=TOKEN_REQUIRED,
        responses={200: inline_serializer("Reserved", {"start_id": serializers.IntegerField(),
                                                       "count": serializers.IntegerField()}),
                   **errors(400, 401, 403, 404, 409, 429, meanings={
                       **NOT_ANNOTATION, 409: "fewer ids than asked for are left in the channel's datatype"})})
    def get(self, request: Any, collection: str, experiment: str, channel: str, count: int) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.WRITE, coll, exp, chan)
        _require_annotation(chan, "reserving ids")
        if not 1 <= count <= MAX_RESERVE:
            raise InvalidRequest(f"the number of ids to reserve must be 1..{MAX_RESERVE}, not {count}")
        return Response({"start_id": reserve(chan, count), "count": count})


class MetaView(APIView):
    """Key-value metadata of one collection, experiment or channel. GET without `key` lists the
    keys; with it, returns the value. POST creates (409 if the key exists), PUT changes, DELETE
    removes (404 if the key does not exist). Reading needs read, the rest write."""

    def _rows(self, request: Any, level: int, names: dict[str, str]) -> tuple[dict[str, Any], Any]:
        coll = lookups.collection(names["collection"])
        exp = lookups.experiment(coll, names["experiment"]) if "experiment" in names else None
        chan = lookups.channel(exp, names["channel"]) if exp is not None and "channel" in names else None
        auth.require(request.user, level, coll, exp, chan)
        where = {"collection": coll, "experiment": exp, "channel": chan}
        return where, MetaValue.objects.filter(**where)

    @staticmethod
    def _record(request: Any, action: str, names: dict[str, str], key: str, value: str | None = None) -> None:
        extra = {} if value is None else {"value": value[:256]}
        audit.record(request, action=action, resource="/".join(names.values()), key=key, **extra)

    def _param(self, request: Any, name: str, limit: int) -> str:
        value = request.query_params.get(name)
        if value is None or value == "":
            raise InvalidRequest(f"the {name} query parameter is required")
        if len(value) > limit:
            raise InvalidRequest(f"{name} is longer than {limit} characters")
        return str(value)

    def _row(self, request: Any, rows: Any, names: dict[str, str]) -> MetaValue:
        key = self._param(request, "key", MAX_META_KEY)
        row = rows.filter(key=key).first()
        if row is None:
            raise NotFound(f"{'/'.join(names.values())} has no metadata key {key!r}")
        return row  # type: ignore[no-any-return]

    @extend_schema(
        summary="List metadata keys, or read one",
        parameters=[OpenApiParameter("key", str, description="the key to read; without it, the keys are listed")],
        responses={200: PolymorphicProxySerializer(
                       "MetaRead", resource_type_field_name=None,
                       serializers=[inline_serializer("MetaKeys", {"keys": serializers.ListField(
                                        child=serializers.CharField())}), META_PAIR]),
                   **errors(400, 401, 403, 404, 429)})
    def get(self, request: Any, **names: str) -> Response:
        _, rows = self._rows(request, auth.READ, names)
        if "key" not in request.query_params:
            return Response({"keys": sorted(rows.values_list("key", flat=True))})
        row = self._row(request, rows, names)
        return Response({"key": row.key, "value": row.value})

    @extend_schema(summary="Add a metadata key", request=None, parameters=[META_KEY, META_VALUE],
                   responses={201: META_PAIR, **errors(400, 401, 403, 404, 409, 503)})
    def post(self, request: Any, **names: str) -> Response:
        where, rows = self._rows(request, auth.WRITE, names)
        key = self._param(request, "key", MAX_META_KEY)
        value = self._param(request, "value", MAX_META_VALUE)
        self._record(request, "create", names, key, value)
        try:
            with transaction.atomic():
                MetaValue.objects.create(**where, key=key, value=value)
        except IntegrityError:
            raise Conflict(f"{'/'.join(names.values())} already has metadata key {key!r}; PUT to change it") from None
        return Response({"key": key, "value": value}, status=201)

    @extend_schema(summary="Change a metadata value", request=None, parameters=[META_KEY, META_VALUE],
                   responses={200: META_PAIR, **errors(400, 401, 403, 404, 503)})
    def put(self, request: Any, **names: str) -> Response:
        _, rows = self._rows(request, auth.WRITE, names)
        row = self._row(request, rows, names)
        row.value = self._param(request, "value", MAX_META_VALUE)
        self._record(request, "change", names, row.key, row.value)
        row.save(update_fields=["value"])
        return Response({"key": row.key, "value": row.value})

    @extend_schema(summary="Delete a metadata key", request=None, parameters=[META_KEY],
                   responses={204: OpenApiResponse(None, description="deleted"), **errors(400, 401, 403, 404, 503)})
    def delete(self, request: Any, **names: str) -> Response:
        _, rows = self._rows(request, auth.WRITE, names)
        row = self._row(request, rows, names)
        self._record(request, "delete", names, row.key)
        row.delete()
        return Response(status=204)


@extend_schema(summary="Malformed URL", description="Any other path under a Boss prefix: a 400 showing the URL's "
               "shape.", request=None, responses=errors(400, 401))
class MalformedBossRoute(APIView):
    """Any other path under a Boss prefix: say what the URL must look like."""

    shapes = {
        "ids": "ids/{collection}/{experiment}/{channel}/{resolution}/{x0}:{x1}/{y0}:{y1}/{z0}:{z1}/[{t0}:{t1}/]",
        "boundingbox": "boundingbox/{collection}/{experiment}/{channel}/{resolution}/{id}/?type=loose|tight",
        "reserve": "reserve/{collection}/{experiment}/{channel}/{count}",
        "meta": "meta/{collection}[/{experiment}[/{channel}]]/?key=...[&value=...]",
    }

    def refuse(self, request: Any, **kw: Any) -> Response:
        prefix = request.path.split("/")[2]
        raise InvalidRequest(f"malformed URL; expected /v1/{self.shapes[prefix]} with integer ids and ranges")

    get = post = put = delete = refuse


def _both(route: str, view: Any) -> list[URLPattern]:
    """The route with and without its trailing slash (intern asks for both forms)."""
    return [path(route, view), path(f"{route}/", view)]


def routes() -> list[URLPattern]:
    """Boss compatibility routes; they go before the cutout routes (to_black shares their prefix)."""
    meta = MetaView.as_view()
    return [
        path("v1/collection//", resources.CollectionList.as_view()),
        path("v1/collection/<name:name>", resources.CollectionView.as_view()),
        path("v1/collection/<name:collection>/experiment/<name:name>", resources.ExperimentView.as_view()),
        path("v1/collection/<name:collection>/experiment/<name:experiment>/channel/<name:name>",
             resources.ChannelView.as_view()),
        path("v1/coord/<name:name>", resources.CoordFrameView.as_view()),
        path(f"v1/cutout/to_black/{BOX}", ToBlackView.as_view()),
        path(f"v1/cutout/to_black/{BOX}<range:t>/", ToBlackView.as_view()),
        path(f"v1/ids/{BOX}", IdsView.as_view()),
        path(f"v1/ids/{BOX}<range:t>/", IdsView.as_view()),
        path(f"v1/boundingbox/{CHANNEL}/<int:resolution>/<int:label>/", BoundingBoxView.as_view()),
        *_both(f"v1/reserve/{CHANNEL}/<int:count>", ReserveView.as_view()),
        *_both("v1/meta/<name:collection>", meta),
        *_both("v1/meta/<name:collection>/<name:experiment>", meta),
        *_both(f"v1/meta/{CHANNEL}", meta),
        *[path(f"v1/{prefix}/<path:rest>", MalformedBossRoute.as_view()) for prefix in MalformedBossRoute.shapes],
    ]
