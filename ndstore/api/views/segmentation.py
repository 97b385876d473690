"""`/v1/segmentation/{c}/{e}/{ch}/`: a label channel's segmentation products (meshes, skeletons)
and how current they are (docs/design/segmentation.md).

GET (read on the channel): how many supercuboids' fragments are stale, the lag of the oldest,
what was skipped and why, the rebuild queue; `?segment={id}`: the same for one segment's
supercuboids. POST (admin on the channel) queues a rebuild of every fragment of the channel's
stored supercuboids (level 0, its default time sample): for a channel made before products were
kept, or to recover from a mark that could not be written.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups
from ndstore.api.models import Channel
from ndstore.api.schema import errors
from ndstore.core.errors import InvalidRequest, NotFound
from ndstore.engine.segments.upkeep import ProductUpkeep
from ndstore.wiring import services

MAX_LABEL = (1 << 64) - 1

STATUS = inline_serializer("SegmentationStatus", {
    "stale": serializers.IntegerField(help_text="supercuboids whose fragments wait for a rebuild"),
    "lag_s": serializers.FloatField(help_text="seconds since the oldest of them was written (0: all current)"),
    "skipped": serializers.ListField(child=inline_serializer("SkippedFragment", {
        "kind": serializers.ChoiceField(choices=["mesh", "skeleton"]),
        "supercuboid": serializers.CharField(), "reason": serializers.CharField()})),
    "queue": inline_serializer("SegmentationQueue", {"waiting": serializers.IntegerField(),
                                                     "in_flight": serializers.IntegerField()}),
})
BUILD = inline_serializer("SegmentationBuild", {
    "queued": serializers.IntegerField(help_text="supercuboids whose fragments are rebuilt"),
    "status": STATUS,
})
SEGMENT = OpenApiParameter("segment", str, description="a segment id (decimal, 1 .. 2^64-1): only its supercuboids")


def _products() -> ProductUpkeep:
    products = services().products
    if products is None:
        raise NotFound("segmentation products are off: they need the label index (NDSTORE_LABEL_BACKEND)")
    return products


def segment_id(raw: str) -> int:
    """A segment id from a URL or query: decimal, 1 .. 2^64-1 (0 is the background)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20 or not 0 < int(raw) <= MAX_LABEL:
        raise InvalidRequest(f"segment id {raw[:40]!r} is not a decimal label in 1 .. {MAX_LABEL} "
                             "(0 is the background)")
    return int(raw)


class SegmentationView(APIView):
    @extend_schema(summary="How current a label channel's meshes and skeletons are", parameters=[SEGMENT],
                   responses={200: STATUS, **errors(400, 401, 403, 404, 429, 503)})
    def get(self, request: Any, collection: str, experiment: str, channel: str) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.READ, coll, exp, chan)
        _require_labels(chan)
        raw = request.query_params.get("segment")
        label = None if raw is None else segment_id(raw)
        volume = lookups.channel_volume(chan).volume_key(0, chan.default_time_sample)
        return Response(_products().status(volume, label))

    @extend_schema(summary="Rebuild every mesh and skeleton of a label channel", request=None,
                   description="Needs admin on the channel. Queues a rebuild of the fragments of every stored "
                               "supercuboid; GET reports the progress.",
                   responses={202: BUILD, **errors(400, 401, 403, 404, 503)})
    def post(self, request: Any, collection: str, experiment: str, channel: str) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.ADMIN, coll, exp, chan)
        _require_labels(chan)
        products = _products()
        services().index.require_fresh()  # the build lists the stored supercuboids
        audit.record(request, action="build segmentation", channel=f"{collection}/{experiment}/{channel}")
        spec = lookups.product_spec(chan)
        volume = spec.channel.volume_key(0, chan.default_time_sample)
        queued = products.build_all(spec, services().index.mortons(volume), chan.default_time_sample)
        return Response({"queued": queued, "status": products.status(volume)}, status=202)


def _require_labels(chan: Channel) -> None:
    if chan.type != "annotation":
        raise InvalidRequest(f"channel {chan.name!r} is an image channel: segmentation products are made of "
                             "annotation (label) channels")
