"""`/v1/blaze/merge/`: the state of the NDBlaze buffer, and on-demand merges (staff only)."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth
from ndstore.core.errors import NotFound
from ndstore.wiring import services


class BlazeMergeView(APIView):
    def get(self, request: Any) -> Response:
        """What awaits merging (bytes, blobs, supercuboids, the oldest write's age) and the live
        merger, if one beats (null when none does: pending writes then wait)."""
        auth.require_login(request.user, "see the NDBlaze buffer")
        svc = services()
        return Response({"pending": svc.blaze_buffer.stats().as_dict(), "merger": svc.merger_presence.merger()})

    def post(self, request: Any) -> Response:
        """Ask the merger daemon for a merge round now; 202 with where to watch it."""
        auth.require_staff(request.user, "start an NDBlaze merge")
        audit.record(request, action="merge")
        request_id = services().merge_requests.request_merge()
        return Response({"request": request_id, "state": "queued", "status": f"/v1/blaze/merge/{request_id}/"},
                        status=202)


class BlazeMergeRequestView(APIView):
    def get(self, request: Any, request_id: str) -> Response:
        auth.require_login(request.user, "see an NDBlaze merge")
        status = services().merge_requests.merge_status(request_id)
        if status is None:
            raise NotFound(f"no NDBlaze merge request {request_id!r}")
        return Response({"request": request_id, **status})
