"""`GET /v1/audit/`: the audit log (ndstore.api.audit), newest first, for superusers only.
Query: `limit` (1..1000, default 100), `user`, `path` (a prefix), `before` (an entry id: page on)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api.models import AuditEntry
from ndstore.core.errors import InvalidRequest


def _int(params: Any, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise InvalidRequest(f"{name} must be an integer from {lo} to {hi}, not {raw!r}")
    return int(raw)


class AuditLogView(APIView):
    def get(self, request: Any) -> Response:
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated("a superuser's token is required to read the audit log")
        if not request.user.is_superuser:
            raise exceptions.PermissionDenied("only superusers may read the audit log")
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
