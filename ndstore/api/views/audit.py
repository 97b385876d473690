"""`GET /v1/audit/`: the audit log (ndstore.api.audit), newest first, for superusers only.
Query: `limit` (1..1000, default 100), `user`, `path` (a prefix), `before` (an entry id: page on)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api.models import AuditEntry
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.core.errors import InvalidRequest


def _int(params: Any, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw) <= hi:
        raise InvalidRequest(f"{name} must be an integer from {lo} to {hi}, not {raw!r}")
    return int(raw)


ENTRY_FIELDS = {
    "id": serializers.IntegerField(),
    "at": serializers.DateTimeField(),
    "user": serializers.CharField(help_text='"" for an anonymous request'),
    "method": serializers.CharField(),
    "path": serializers.CharField(),
    "status": serializers.IntegerField(allow_null=True, help_text="null: recorded before a change whose outcome "
                                                                  "is not known"),
    "remote_addr": serializers.CharField(),
    "body": serializers.JSONField(allow_null=True, help_text="the JSON request body as parsed, when small"),
    "target": serializers.JSONField(allow_null=True, help_text="what the change applies to; null for a refusal"),
}


class AuditLogView(APIView):
    @extend_schema(
        summary="Read the audit log", description="Newest first; for superusers only.",
        parameters=[
            OpenApiParameter("limit", OpenApiTypes.INT, description="entries to return, 1..1000 (default 100)"),
            OpenApiParameter("user", str, description="only this user's entries"),
            OpenApiParameter("path", str, description="only entries whose path starts with this"),
            OpenApiParameter("before", OpenApiTypes.INT, description="only entries older than this id: page on"),
        ],
        auth=TOKEN_REQUIRED,
        responses={200: inline_serializer("AuditLog", {"entries": inline_serializer(
                       "AuditEntry", ENTRY_FIELDS, many=True)}), **errors(400, 401, 403, 429)})
    def get(self, request: Any) -> Response:
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated("a superuser's token is required to read the audit log")
        if not request.user.is_superuser:  # nor is a scoped token's user (scopes.py)
            raise exceptions.PermissionDenied("only superusers may read the audit log, with an unscoped token")
        q = request.query_params
        entries = AuditEntry.objects.all()
        if q.get("user") is not None:
            entries = entries.filter(username=q["user"])
        if q.get("path"):
            entries = entries.filter(path__startswith=q["path"])
        before = _int(q, "before", None, 1, 2**62)
        if before is not None:
            entries = entries.filter(id__lt=before)
        limit = _int(q, "limit", 100, 1, 1000)
        rows = entries.order_by("-id")[:limit]
        return Response({"entries": [
            {"id": e.id, "at": e.at.isoformat(), "user": e.username, "method": e.method, "path": e.path,
             "status": e.status, "remote_addr": e.remote_addr, "body": e.body, "target": e.target} for e in rows]})
