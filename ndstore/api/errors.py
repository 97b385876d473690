"""The one place where domain errors become HTTP responses: {"status": ..., "message": ...}."""

from __future__ import annotations

import logging
from typing import Any

from django.http import Http404
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ndstore.core import errors
from ndstore.core.signing import BadSignature

log = logging.getLogger(__name__)

STATUS = {
    errors.InvalidRequest: 400,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.StorageError: 503,
    errors.DataCorrupt: 500,
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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, errors.NDStoreError):
        code = status_of(exc)
        if code >= 500:
            log.warning("storage failure: %s", exc) if code == 503 else log.error("data corrupt: %s", exc)
        response = Response({"status": code, "message": str(exc)}, status=code)
        if isinstance(exc, errors.StorageError):
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
