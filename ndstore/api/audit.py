"""The audit log of administrative actions: every state-changing request (POST, PUT, PATCH,
DELETE) to the control plane — resources, their metadata, permissions, ingest and downsample
jobs, NDBlaze merges — with who made it, from where, its target as the view parsed it (whether
the client spelled it in the query string or the body), the body as parsed, and how it ended.
Refused requests are recorded too.

Write-ahead: a view calls `record(request, ...)` once it has parsed and authorised a change and
before it makes any of it. The row is committed then; if it cannot be written the view stops with
AuditUnavailable (503) and nothing changes. The middleware fills in the outcome afterwards, and
writes the row of a request refused before any view recorded it.

The data plane (cutouts, tiles and their upload tasks, NDBlaze writes, Boss id reservations) is
not audited: its volume would drown the log, and its writes are the users' data, not
administration. Django admin's own changes are in its LogEntry table as well.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from rest_framework.throttling import BaseThrottle

from ndstore.api.gate import CONTROL_PLANE, UNSAFE
from ndstore.api.models import AuditEntry
from ndstore.core.errors import StorageError

log = logging.getLogger(__name__)
DATA_PLANE = re.compile(r"^/v1/ingest/(\d+/(tasks|uploads)/|tiles/)")  # upload work, not administration
MAX_BODY = 4096


class AuditUnavailable(StorageError):
    """The audit row of a change could not be written, so the change was not made (503)."""


def audited(method: str, path: str) -> bool:
    return method in UNSAFE and path.startswith(CONTROL_PLANE) and not DATA_PLANE.match(path)


def _body(request: HttpRequest) -> Any:
    """The JSON body as the parser read it (json_body.py), when one was parsed and it is small."""
    if not hasattr(request, "ndstore_json"):
        return None
    body = request.ndstore_json
    return body if len(json.dumps(body)) <= MAX_BODY else {"omitted": f"over {MAX_BODY} bytes"}


def client_address(request: HttpRequest) -> str:
    """The client's address as the rate limits see it: X-Forwarded-For's hop that the trusted
    proxies (NDSTORE_NUM_PROXIES, the node's own front included) vouch for."""
    return BaseThrottle().get_ident(request) or ""  # type: ignore[arg-type]


def _entry(request: HttpRequest, user: Any, status: int | None, target: dict[str, Any] | None) -> AuditEntry:
    with transaction.atomic():  # a savepoint inside a caller's transaction: a refused insert spoils nothing
        return AuditEntry.objects.create(
            username=user.get_username() if user is not None and user.is_authenticated else "",
            method=request.method, path=request.path[:1024], status=status,
            remote_addr=client_address(request)[:64], body=_body(request), target=target)


def record(request: Any, **target: Any) -> None:
    """Write the audit row of the change this request is about to make (DRF's request or
    Django's). Raises AuditUnavailable when it cannot: the caller must not make the change."""
    django_request: HttpRequest = getattr(request, "_request", request)
    try:
        django_request.ndstore_audit = _entry(django_request, request.user, None, target)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - whatever the database says, the change must not happen
        log.error("audit row of %s %s not written, change refused: %s", django_request.method, django_request.path,
                  exc)
        raise AuditUnavailable(f"the audit log could not be written ({type(exc).__name__}); nothing was changed: "
                               "retry later") from None


class AuditMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not audited(request.method or "", request.path):
            return self.get_response(request)
        response = self.get_response(request)
        entry: AuditEntry | None = getattr(request, "ndstore_audit", None)
        try:
            if entry is not None:
                AuditEntry.objects.filter(pk=entry.pk).update(status=response.status_code)
            else:
                identity = getattr(request, "ndstore_identity", None)  # the gate's, when DRF never ran
                _entry(request, identity[0] if identity else getattr(request, "user", None), response.status_code, None)
        except Exception:  # a change was recorded before it was made; only its outcome is missing
            log.exception("could not record the outcome of %s %s", request.method, request.path)
        if entry is None and response.status_code < 400:
            log.error("%s %s answered %d without a write-ahead audit row", request.method, request.path,
                      response.status_code)
        return response
