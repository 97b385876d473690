"""The audit log of administrative actions: every state-changing request (POST, PUT, PATCH,
DELETE) to the control plane — resources, their metadata, permissions, ingest and downsample
jobs, NDBlaze merges — is recorded with its user, address, JSON body and outcome, refused ones included.
The data plane (cutouts, tiles, NDBlaze writes, Boss id reservations) is not: its volume would
drown the log, and its writes are the users' data, not administration. Django admin's own
changes are in its LogEntry table as well."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from ndstore.api.models import AuditEntry

log = logging.getLogger(__name__)
CONTROL_PLANE = ("/v1/collection/", "/v1/coord/", "/v1/permissions/", "/v1/ingest/", "/v1/downsample/",
                 "/v1/blaze/merge/", "/v1/meta/")
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
MAX_BODY = 4096


def audited(method: str, path: str) -> bool:
    return method in UNSAFE and path.startswith(CONTROL_PLANE)


def _json_body(request: HttpRequest) -> Any:
    if not request.content_type == "application/json" or len(request.body) > MAX_BODY:
        return None
    try:
        return json.loads(request.body)
    except ValueError:
        return None


class AuditMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not audited(request.method or "", request.path):
            return self.get_response(request)
        body = _json_body(request)  # read before the view consumes the stream
        response = self.get_response(request)
        user = getattr(request, "user", None)  # DRF sets the token's user on the Django request
        try:
            AuditEntry.objects.create(
                username=user.get_username() if user is not None and user.is_authenticated else "",
                method=request.method, path=request.path[:1024], status=response.status_code,
                remote_addr=request.META.get("REMOTE_ADDR", "")[:64], body=body)
        except Exception:  # noqa: BLE001 - the action happened; a lost audit row must not undo its answer
            log.exception("could not record the audit entry of %s %s", request.method, request.path)
        return response
