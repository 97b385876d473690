"""The one place where domain errors become HTTP responses: {"status": ..., "message": ...}."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ndstore.core import errors
from ndstore.core.signing import BadSignature
from ndstore.wiring import services

log = logging.getLogger(__name__)

STATUS = {
    errors.InvalidRequest: 400,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.NotAcceptable: 406,
    errors.StorageFull: 507,
    errors.StorageError: 503,
    errors.DataCorrupt: 500,
    errors.DataLost: 503,
    errors.IndexStale: 503,
    errors.LabelIndexNotServing: 503,
    errors.Busy: 503,
    errors.ReadBudgetSpent: 429,
    BadSignature: 403,
}


def status_of(exc: errors.NDStoreError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _message(detail: Any) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_message(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return "; ".join(_message(v) for v in detail)
    return str(detail)


class JSONErrors:
    """For views that answer in binary formats (arrays, images): their errors are JSON whatever
    format the client asked for."""

    request: Any

    def handle_exception(self, exc: Exception) -> Response:
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)  # type: ignore[misc, no-any-return]


def _count(kind: str, code: int) -> None:
    try:
        services().metrics.count("errors_total", kind=kind, status=str(code))
    except Exception:  # noqa: BLE001 - no Redis to count in: the answer goes out anyway
        pass


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _handle(exc, context)
    if response is not None:
        _count(type(exc).__name__, response.status_code)
    return response


def unavailable(exc: BaseException | None) -> tuple[str, float] | None:
    """(message, retry after) when ``exc`` is a dependency failing or not answering (a 503), else None."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return f"the metadata database is not answering: {exc}", 1.0
    if isinstance(exc, errors.StorageError):
        return str(exc), float(getattr(exc, "retry_after_s", 1))
    return None


def _handle(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, (OperationalError, InterfaceError)):
        message, retry = unavailable(exc) or ("", 1.0)
        log.warning("storage failure: %s", message)
        return Response({"status": 503, "message": message}, status=503, headers={"Retry-After": f"{retry:g}"})
    if isinstance(exc, errors.NDStoreError):
        code = status_of(exc)
        if isinstance(exc, (errors.DataCorrupt, errors.DataLost)):
            log.error("%s: %s", type(exc).__name__, exc)
        elif code >= 500 and not isinstance(exc, errors.Busy):
            log.warning("storage failure: %s", exc)
        body: dict[str, Any] = {"status": code, "message": str(exc)}
        if isinstance(exc, errors.DataLost):
            body["lost"] = exc.names[:100]
        response = Response(body, status=code)
        if isinstance(exc, (errors.StorageError, errors.Busy, errors.ReadBudgetSpent)):
            response["Retry-After"] = str(getattr(exc, "retry_after_s", 1))
        return response
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    response = drf_exception_handler(exc, context)
    if response is not None:
        message = _message(getattr(exc, "detail", str(exc)))
        if isinstance(exc, exceptions.Throttled):
            message = (f"too many anonymous requests from this address (NDSTORE_ANON_READ_RATE); retry in "
                       f"{response.get('Retry-After', '1')} s, or authenticate with a token")
        response.data = {"status": response.status_code, "message": message}
    return response


def server_error(request: HttpRequest) -> JsonResponse:
    """What a failure nothing above expected answers (Django's handler500): JSON like every other
    error, so a client parsing {"status", "message"} gets one, and naming nothing of the failure
    itself (its traceback goes to the service's log through Django's `django.request` logger).
    A dependency that failed or did not answer outside a view (the metadata database in the
    token check, a Redis in a middleware) is a 503 naming it, with Retry-After, as in a view."""
    del request
    failure = unavailable(sys.exc_info()[1])
    if failure is not None:
        _count("unavailable", 503)
        response = JsonResponse({"status": 503, "message": failure[0]}, status=503)
        response["Retry-After"] = f"{failure[1]:g}"
        return response
    _count("unexpected", 500)
    return JsonResponse({"status": 500, "message": "internal server error: the service could not answer this "
                                                   "request; its log has the details"}, status=500)
