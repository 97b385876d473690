"""What is checked of a request before any view, parser or other middleware reads its body.

- A request that may change state (POST, PUT, PATCH, DELETE) must carry a valid token: an
  anonymous or badly authenticated one is answered 401 here, its body never read. Django's admin
  (its own login form, session and CSRF checks) is the one exception; its form bodies are capped
  by DATA_UPLOAD_MAX_MEMORY_SIZE.
- A control-plane body (resources, grants, metadata, jobs) may hold at most CONTROL_BODY_LIMIT
  bytes: a larger declared Content-Length is answered 413 here; the JSON parser (json_body.py)
  reads no more than the limit from a body that declared none.
- A tile PUT to the local tile store (`/v1/ingest/tiles/...?signature=`) carries a signature the
  service gave instead of a token: its view checks it before reading the body.
What the caller may do with the target is decided by the view, before it reads the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions

from ndstore.api.auth import TokenAuthentication

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SESSION_AUTHENTICATED = ("/admin/",)
CONTROL_PLANE = ("/v1/collection/", "/v1/coord/", "/v1/permissions/", "/v1/ingest/", "/v1/downsample/",
                 "/v1/blaze/merge/", "/v1/meta/", "/v1/segments/", "/v1/tokens/", "/v1/annotations/")
CONTROL_BODY_LIMIT = 1 << 20
SIGNED_UPLOADS = "/v1/ingest/tiles/"


def refusal(status: int, message: str, **headers: str) -> JsonResponse:
    response = JsonResponse({"status": status, "message": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def declared_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


class RequestGate:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        signed_upload = request.path.startswith(SIGNED_UPLOADS) and "signature" in request.GET
        if request.method in UNSAFE and not request.path.startswith(SESSION_AUTHENTICATED) and not signed_upload:
            refused = self._authenticate(request)
            if refused is not None:
                return refused
        if (request.path.startswith(CONTROL_PLANE) and not signed_upload
                and declared_length(request) > CONTROL_BODY_LIMIT):
            return refusal(413, f"request body of {declared_length(request)} bytes exceeds the control plane's "
                                f"{CONTROL_BODY_LIMIT}-byte limit")
        return self.get_response(request)

    @staticmethod
    def _authenticate(request: HttpRequest) -> HttpResponse | None:
        try:
            identity: Any = TokenAuthentication().authenticate(request)
        except exceptions.AuthenticationFailed as exc:
            return refusal(401, str(exc.detail), WWW_Authenticate="Token")
        if identity is None:
            return refusal(401, f"a token is required to {request.method} {request.path}", WWW_Authenticate="Token")
        return None
