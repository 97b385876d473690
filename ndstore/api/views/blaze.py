"""`/v1/blaze/merge/`: the state of the NDBlaze buffer, and on-demand merges (staff only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.core.errors import NotFound
from ndstore.wiring import services

SECONDS = "seconds since the epoch"
BUFFER = inline_serializer("BlazeBuffer", {
    "pending": inline_serializer("BlazePending", {
        "pending_bytes": serializers.IntegerField(), "blobs": serializers.IntegerField(),
        "supercuboids": serializers.IntegerField(),
        "oldest_age_s": serializers.FloatField(allow_null=True, help_text="null when nothing is pending")}),
    "merger": inline_serializer("BlazeMerger", {
        "master": serializers.CharField(required=False, help_text="its Spark master"),
        "pid": serializers.IntegerField(required=False),
        "since": serializers.FloatField(help_text=SECONDS), "last_beat": serializers.FloatField(help_text=SECONDS),
    }, allow_null=True, help_text="the live merger; null when none beats (pending writes then wait)"),
})
MERGE_REQUEST = inline_serializer("BlazeMergeRequest", {
    "request": serializers.CharField(help_text="the request's id"),
    "state": serializers.ChoiceField(choices=["queued", "running", "done", "failed"]),
    "requested_at": serializers.FloatField(required=False, help_text=f"while queued; {SECONDS}"),
    "started_at": serializers.FloatField(required=False, help_text=f"once running; {SECONDS}"),
    "finished_at": serializers.FloatField(required=False, help_text=f"once done; {SECONDS}"),
    "error": serializers.CharField(required=False, help_text="once failed: why"),
    **{name: serializers.IntegerField(required=False, help_text="once done") for name in (
        "supercuboids", "blobs_applied", "supercuboids_failed", "voxel_bytes")},
    "seconds": serializers.FloatField(required=False, help_text="once done: how long the round took"),
})


class BlazeMergeView(APIView):
    @extend_schema(summary="The NDBlaze buffer and its merger", auth=TOKEN_REQUIRED,
                   responses={200: BUFFER, **errors(401, 429, 503)})
    def get(self, request: Any) -> Response:
        """What awaits merging (bytes, blobs, supercuboids, the oldest write's age) and the live
        merger, if one beats (null when none does: pending writes then wait)."""
        auth.require_unscoped(request.user, "see the NDBlaze buffer")
        svc = services()
        return Response({"pending": svc.blaze_buffer.stats().as_dict(), "merger": svc.merger_presence.merger()})

    @extend_schema(
        summary="Ask for an NDBlaze merge now", request=None,
        responses={202: inline_serializer("BlazeMergeQueued", {
                       "request": serializers.CharField(help_text="the request's id"),
                       "state": serializers.ChoiceField(choices=["queued"]),
                       "status": serializers.CharField(help_text="where to watch it: /v1/blaze/merge/{request}/")}),
                   **errors(401, 403, 503)})
    def post(self, request: Any) -> Response:
        """Ask the merger daemon for a merge round now; 202 with where to watch it."""
        auth.require_staff(request.user, "start an NDBlaze merge")
        audit.record(request, action="merge")
        request_id = services().merge_requests.request_merge()
        return Response({"request": request_id, "state": "queued", "status": f"/v1/blaze/merge/{request_id}/"},
                        status=202)


class BlazeMergeRequestView(APIView):
    @extend_schema(summary="How an NDBlaze merge request went",
                   parameters=[OpenApiParameter("request_id", str, OpenApiParameter.PATH,
                                                description="the id POST /v1/blaze/merge/ answered")],
                   auth=TOKEN_REQUIRED, responses={200: MERGE_REQUEST, **errors(401, 404, 429, 503)})
    def get(self, request: Any, request_id: str) -> Response:
        auth.require_unscoped(request.user, "see an NDBlaze merge")
        status = services().merge_requests.merge_status(request_id)
        if status is None:
            raise NotFound(f"no NDBlaze merge request {request_id!r}")
        return Response({"request": request_id, **status})
