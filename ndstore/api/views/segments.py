"""Segment properties of annotation channels (docs/api.md, "Segment properties").

- `/v1/segments/{c}/{e}/{ch}/`: GET lists what users wrote (ascending ids, `?after=&limit=`);
  POST or PUT writes up to MAX_PER_REQUEST segments at once (each named segment's name,
  description and tags replaced, others untouched).
- `/v1/segments/{c}/{e}/{ch}/{id}/`: GET, PUT (replace) or DELETE one.
- `/precomputed[-sharded]/{c}/{e}/{ch}/segment_properties/info`: Neuroglancer's
  `neuroglancer_segment_properties` file, read-only: what users wrote merged with the voxel
  counts and bounding boxes of the label index (ndstore.engine.segments.properties).

Reading needs read permission on the channel, writing write permission; a write is audited
before it is made (ndstore.api.audit); bodies are the control plane's JSON (1 MiB, depth 32:
ndstore.api.json_body), read only once the caller is known and allowed. Only annotation channels
have segments (400 otherwise; the file: 404). A channel holds at most MAX_PER_CHANNEL segments
with written properties.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, budget, lookups
from ndstore.api.models import AnnotationSegment, Channel, SegmentProperty, label_key, unsigned_id
from ndstore.api.schema import errors
from ndstore.api.segment_input import MAX_PER_REQUEST, parse_bulk, parse_id, parse_segment
from ndstore.api.views.precomputed import NOT_MODIFIED, PrecomputedView, channel_file, channel_for
from ndstore.core.errors import Conflict, InvalidRequest, NotFound
from ndstore.core.keys import SEPARATOR
from ndstore.engine.segments.properties import MAX_LISTED, Written, label_extents, segment_properties
from ndstore.wiring import services

MAX_PER_CHANNEL = 100_000
LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10_000
BATCH = 1000  # ids per `IN (...)` query
NOT_ANNOTATION = {400: "bad id or body, or the channel is not an annotation channel"}

SEGMENT = inline_serializer("Segment", {
    "id": serializers.CharField(help_text="the label, a decimal string (uint64)"),
    "name": serializers.CharField(allow_blank=True), "description": serializers.CharField(allow_blank=True),
    "tags": serializers.ListField(child=serializers.CharField()),
})
SEGMENT_WRITE = inline_serializer("SegmentWrite", {
    "id": serializers.CharField(required=False, help_text="the label, a decimal string; optional in a PUT of one"),
    "name": serializers.CharField(required=False, allow_blank=True, max_length=256),
    "description": serializers.CharField(required=False, allow_blank=True, max_length=4096),
    "tags": serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=32),
})
BULK = type(SEGMENT_WRITE)(many=True, max_length=MAX_PER_REQUEST)  # the same component, as a list
PAGE = inline_serializer("SegmentPage", {
    "segments": serializers.ListField(child=SEGMENT),
    "next": serializers.CharField(allow_null=True, help_text="the `after` of the next page; null on the last"),
})
WRITTEN = inline_serializer("SegmentsWritten", {"written": serializers.IntegerField()})
ID = OpenApiParameter("label", str, OpenApiParameter.PATH, description="the label, 1..2^64-1 in decimal")


def _channel(request: Any, kw: dict[str, Any], level: int) -> Channel:
    coll, exp, chan = lookups.channel_path(kw["collection"], kw["experiment"], kw["channel"])
    auth.require(request.user, level, coll, exp, chan)
    if chan.type != "annotation":
        raise InvalidRequest(f"segment properties belong to annotation channels; {chan.name} is an {chan.type} "
                             "channel")
    return chan


def _top(chan: Channel) -> int:
    return int(np.iinfo(chan.datatype).max)


def _shown(row: SegmentProperty) -> dict[str, Any]:
    return {"id": str(int(row.label)), "name": row.name, "description": row.description, "tags": row.tags}


def _path(kw: dict[str, Any]) -> str:
    return f"{kw['collection']}/{kw['experiment']}/{kw['channel']}"


def _write(request: Any, chan: Channel, segments: dict[int, Written], path: str) -> None:
    """Audit, then upsert: each segment's fields replaced (at most MAX_PER_CHANNEL per channel)."""
    keys = [label_key(label) for label in segments]
    rows = SegmentProperty.objects.filter(channel=chan)
    old = sum(rows.filter(label__in=keys[i:i + BATCH]).count() for i in range(0, len(keys), BATCH))
    if rows.count() + len(keys) - old > MAX_PER_CHANNEL:
        raise Conflict(f"a channel holds at most {MAX_PER_CHANNEL} segments with properties; delete some first")
    audit.record(request, action="write", channel=path, ids=[str(label) for label in segments])
    now = timezone.now()
    with transaction.atomic():
        SegmentProperty.objects.bulk_create(
            [SegmentProperty(channel=chan, label=label_key(label), name=w.name, description=w.description,
                             tags=list(w.tags), updated=now) for label, w in segments.items()],
            batch_size=BATCH, update_conflicts=True, unique_fields=["channel", "label"],
            update_fields=["name", "description", "tags", "updated"])


class SegmentList(APIView):
    @extend_schema(summary="The segments of a channel that have written properties", parameters=[
        OpenApiParameter("after", str, description="list ids above this one (the previous page's `next`)"),
        OpenApiParameter("limit", int, description=f"at most this many, 1..{MAX_LIST_LIMIT} (default {LIST_LIMIT})")],
        responses={200: PAGE, **errors(400, 401, 403, 404, 429, meanings=NOT_ANNOTATION)})
    def get(self, request: Any, **kw: Any) -> Response:
        chan = _channel(request, kw, auth.READ)
        after = request.query_params.get("after")
        start = label_key(parse_id(after, _top(chan), "after")) if after is not None else ""
        raw = request.query_params.get("limit", str(LIST_LIMIT))
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
            raise InvalidRequest(f"limit must be 1..{MAX_LIST_LIMIT}, not {raw[:20]!r}")
        limit = int(raw)
        rows = list(SegmentProperty.objects.filter(channel=chan, label__gt=start).order_by("label")[:limit + 1])
        more = len(rows) > limit
        return Response({"segments": [_shown(r) for r in rows[:limit]],
                         "next": str(int(rows[limit - 1].label)) if more else None})

    @extend_schema(summary="Write segments' properties",
                   description=f"A JSON list of at most {MAX_PER_REQUEST} segments (and 1 MiB); each one's name, "
                               "description and tags are replaced (missing fields: empty). Write permission.",
                   request=BULK,
                   responses={200: WRITTEN, **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings={
                       **NOT_ANNOTATION, 409: f"the channel would hold over {MAX_PER_CHANNEL} segments"})})
    def post(self, request: Any, **kw: Any) -> Response:
        chan = _channel(request, kw, auth.WRITE)  # before the body is read
        segments = parse_bulk(request.data, _top(chan))
        _write(request, chan, segments, _path(kw))
        return Response({"written": len(segments)})

    @extend_schema(summary="Write segments' properties (as POST)", request=BULK,
                   responses={200: WRITTEN, **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings=NOT_ANNOTATION)})
    def put(self, request: Any, **kw: Any) -> Response:
        return self.post(request, **kw)


class SegmentView(APIView):
    def _label(self, chan: Channel, kw: dict[str, Any]) -> int:
        return parse_id(kw["label"], _top(chan), "the id in the path")

    @extend_schema(summary="One segment's properties", parameters=[ID],
                   responses={200: SEGMENT, **errors(400, 401, 403, 404, 429, meanings={
                       **NOT_ANNOTATION, 404: "no such channel, or no properties written for this id"})})
    def get(self, request: Any, **kw: Any) -> Response:
        chan = _channel(request, kw, auth.READ)
        label = self._label(chan, kw)
        row = SegmentProperty.objects.filter(channel=chan, label=label_key(label)).first()
        if row is None:
            raise NotFound(f"no properties are written for segment {label} of {chan.name}")
        return Response(_shown(row))

    @extend_schema(summary="Write one segment's properties", parameters=[ID], request=SEGMENT_WRITE,
                   responses={200: SEGMENT, **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings=NOT_ANNOTATION)})
    def put(self, request: Any, **kw: Any) -> Response:
        chan = _channel(request, kw, auth.WRITE)
        label = self._label(chan, kw)
        _, written = parse_segment(request.data, _top(chan), path_id=label)
        _write(request, chan, {label: written}, _path(kw))
        return Response({"id": str(label), "name": written.name, "description": written.description,
                         "tags": list(written.tags)})

    @extend_schema(summary="Delete one segment's properties", parameters=[ID], request=None,
                   responses={204: OpenApiResponse(None, description="deleted"),
                              **errors(400, 401, 403, 404, 503, meanings=NOT_ANNOTATION)})
    def delete(self, request: Any, **kw: Any) -> Response:
        chan = _channel(request, kw, auth.WRITE)
        label = self._label(chan, kw)
        rows = SegmentProperty.objects.filter(channel=chan, label=label_key(label))
        if not rows.exists():
            raise NotFound(f"no properties are written for segment {label} of {chan.name}")
        audit.record(request, action="delete", channel=_path(kw), ids=[str(label)])
        rows.delete()
        return Response(status=204)


PROPERTIES = inline_serializer("SegmentProperties", {
    "@type": serializers.CharField(help_text="neuroglancer_segment_properties"),
    "inline": inline_serializer("InlineSegmentProperties", {
        "ids": serializers.ListField(child=serializers.CharField(), help_text="decimal, ascending"),
        "properties": serializers.ListField(child=serializers.DictField(), help_text=(
            "label, description, tags, then the numbers voxels, x0, y0, z0, x1, y1, z1 (supercuboid-aligned box, "
            "level-0 voxels, half-open)")),
    }),
    "ndstore": serializers.DictField(help_text="how many segments the channel has, and how many were left out"),
})


def annotation_counts(chan: Channel, most: int = MAX_LISTED) -> dict[str, dict[int, int]]:
    """`{layer}_{relationship}` -> segment -> how many annotations of the layer relate to it so,
    for every annotation layer whose relationships refer to this channel: at most `most` counts
    in all, each layer's largest first (the database sorts them), layers in name order. Writers
    may relate annotations to any number of segment ids; the file lists at most MAX_LISTED
    segments, and a worker holds no more."""
    out: dict[str, dict[int, int]] = {}
    room = most
    for layer in chan.annotation_layers.order_by("name"):
        out.update({f"{layer.name}_{rel}": {} for rel in layer.relationships})
        if room <= 0:
            continue
        counts = (AnnotationSegment.objects.filter(layer=layer).values_list("relationship", "segment")
                  .annotate(n=Count("id")).order_by("-n", "relationship", "segment")[:room])
        for rel, segment, n in counts:
            out[f"{layer.name}_{layer.relationships[rel]}"][unsigned_id(segment)] = n
            room -= 1
    return out


class SegmentPropertiesFile(PrecomputedView):
    @extend_schema(summary="A label channel's segment properties (Neuroglancer)", responses={
        200: PROPERTIES, 304: NOT_MODIFIED, **errors(401, 403, 404, 429, 503, meanings={
            404: "no such channel, or not an annotation channel",
            503: "the label index does not serve this channel yet"})})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        return self.read(request, kw)

    def read(self, request: Any, kw: dict[str, Any]) -> HttpResponse:
        chan, volume, _ = channel_for(request, kw)
        if chan.type != "annotation":
            raise NotFound(f"{chan.name} is an {chan.type} channel: only annotation channels have segment properties")
        # cached writes reach the base tier and its label index first (read-after-write, as boundingbox)
        services().plane.cache.write_back(f"{volume.name_prefix}0{SEPARATOR}")
        extents = label_extents(services().labels, volume.volume_key(0, chan.default_time_sample), volume.grid(0),
                                volume.extent(0))
        rows = SegmentProperty.objects.filter(channel=chan)
        written = [int(label) for label in rows.values_list("label", flat=True)]
        linked = annotation_counts(chan)
        # the JSON text at most (the index entries were read already, and are about as large)
        estimate = min(200 * (len(extents) + len(written) + sum(map(len, linked.values()))), 48 << 20)
        budget.reserve(request, estimate, None, reading=estimate)

        def fetch(labels: list[int]) -> dict[int, Written]:
            return {int(r.label): Written(r.name, r.description, r.tags)
                    for r in rows.filter(label__in=[label_key(label) for label in labels])}

        body = json.dumps(segment_properties(extents, written, fetch, linked=linked), separators=(",", ":")).encode()
        # its annotation counts change with every annotation write, which shows at once: asked again each
        # time (the ETag answers a 304 while nothing changed)
        return channel_file(chan, body, "application/json", revalidate=True)


# Tails under /precomputed/{c}/{e}/{ch}/ and /precomputed-sharded/{c}/{e}/{ch}/, mounted by ndstore.api.urls.
ROUTES: list[tuple[str, type[PrecomputedView]]] = [("segment_properties/info", SegmentPropertiesFile)]
API_ROUTES: list[tuple[str, type[APIView]]] = [("", SegmentList), ("<str:label>/", SegmentView)]
