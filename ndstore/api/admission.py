"""The front's question before it reads a request body: may this caller send a body of this
length to this route? (DESIGN §9: no body is read, parsed or buffered before the caller is
known and allowed.)

The front (ndstore/ops/front.py) asks it with nginx's `auth_request` for every request that
declares a body of its ADMISSION_BYTES (100,000) or more, or of unknown length, before it reads
a byte of the body; it sends the request's method, URI and headers, never its body, to
ADMIT_PATH. The answer:

- a body of unknown length (`Transfer-Encoding: chunked`): 411, send a Content-Length;
- a GET, HEAD or OPTIONS with a body: 413, they carry none;
- what the request gate refuses unread (ndstore/api/gate.py): 401 without a valid token for a
  state change, 413 past the control plane's 1 MiB;
- what the route's view decides before it reads the body (a view's `body_limit(request, kw)`:
  the cutout routes check the caller's write grant on the channel and bound the body by the box,
  403/404/400/413 as the view itself answers), else CONTROL_BODY_LIMIT for a state change;
- a declared length past that limit: 413.

Refusals answer 403 with the real status and the JSON body in headers (auth_request passes on
only 401 and 403; the front answers with them), and are audited like a refusal by the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, QueryDict
from django.urls import Resolver404, resolve
from rest_framework import exceptions

from ndstore.api.audit import AuditMiddleware
from ndstore.api.auth import TokenAuthentication
from ndstore.api.errors import exception_handler
from ndstore.api.gate import CONTROL_BODY_LIMIT, RequestGate, declared_length, refusal
from ndstore.api.latest import ALIAS, CANONICAL
from ndstore.core.errors import NDStoreError

ADMIT_PATH = "/_ndstore/admit"
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_FORMS = "/admin/"  # Django's admin: its own login form and session (DATA_UPLOAD_MAX_MEMORY_SIZE)


class Admission:
    """Middleware, first of all: answers ADMIT_PATH, passes everything else on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path != ADMIT_PATH:
            return self.get_response(request)
        asked = _asked(request)
        refused = decide(asked)
        if refused is None:
            return HttpResponse(status=204)
        AuditMiddleware(lambda _: refused)(asked)  # audited as the gate's refusals are
        answer = HttpResponse(status=401 if refused.status_code == 401 else 403)
        answer["X-Ndstore-Status"] = str(refused.status_code)
        answer["X-Ndstore-Refusal"] = refused.content.decode()
        return answer


def _asked(request: HttpRequest) -> HttpRequest:
    """The request the front holds, as Django would see it, without its body."""
    meta = request.META
    uri = meta.get("HTTP_X_NDSTORE_URI", "/")
    path, _, query = uri.partition("?")
    if path.startswith(ALIAS):
        path = CANONICAL + path[len(ALIAS):]
    asked = HttpRequest()
    asked.META = {k: v for k, v in meta.items() if not k.startswith("HTTP_X_NDSTORE_")}
    asked.method = meta.get("HTTP_X_NDSTORE_METHOD", "GET").upper()
    asked.path = asked.path_info = path
    asked.META.update(REQUEST_METHOD=asked.method, PATH_INFO=path, QUERY_STRING=query,
                      CONTENT_LENGTH=meta.get("HTTP_X_NDSTORE_LENGTH", ""))
    asked.GET = QueryDict(query)
    asked.ndstore_chunked = meta.get("HTTP_X_NDSTORE_CHUNKED", "0") == "1"  # type: ignore[attr-defined]
    return asked


def decide(asked: HttpRequest) -> HttpResponse | None:
    """None when the front may read the body, else the refusal it answers."""
    method, length = asked.method or "GET", declared_length(asked)
    if getattr(asked, "ndstore_chunked", False):
        return refusal(411, "a request body needs a Content-Length: bodies of unknown length (chunked) are not "
                            "taken")
    if method in SAFE:
        return refusal(413, f"a {method} request carries no body; this one declared {length} bytes")
    if asked.path.startswith(SESSION_FORMS):
        return _past(length, settings.DATA_UPLOAD_MAX_MEMORY_SIZE, asked)
    gated = RequestGate(lambda _: HttpResponse(status=204))(asked)
    if gated.status_code != 204:
        return gated
    try:
        limit = body_limit(asked)
    except (NDStoreError, exceptions.APIException) as exc:
        return _refusal_of(exc)
    return _past(length, limit, asked)


def body_limit(asked: HttpRequest) -> int:
    """The most bytes the route takes from this caller (its view's `body_limit`, else the
    control plane's limit)."""
    try:
        match = resolve(asked.path)
    except Resolver404:
        return CONTROL_BODY_LIMIT
    view = getattr(match.func, "view_class", None)
    limit = getattr(view, "body_limit", None) if method_allowed(view, asked.method or "") else None
    if limit is None:
        return CONTROL_BODY_LIMIT
    identity = TokenAuthentication().authenticate(asked)
    asked.user = identity[0] if identity else _anonymous()  # type: ignore[attr-defined]
    return int(limit(view(), asked, dict(match.kwargs)))  # type: ignore[misc]


def method_allowed(view: Any, method: str) -> bool:
    return view is not None and hasattr(view, method.lower())


def _anonymous() -> Any:
    from django.contrib.auth.models import AnonymousUser

    return AnonymousUser()


def _past(length: int, limit: int, asked: HttpRequest) -> HttpResponse | None:
    if length <= limit:
        return None
    return refusal(413, f"request body of {length} bytes exceeds the {limit} bytes {asked.method} {asked.path} "
                        "takes from this caller")


def _refusal_of(exc: Exception) -> HttpResponse:
    response = exception_handler(exc, {})
    if response is None:
        raise exc
    status = response.status_code
    message = response.data.get("message", str(exc)) if isinstance(response.data, dict) else str(exc)
    answer = refusal(status, message)
    if status == 401:
        answer["WWW-Authenticate"] = "Token"
    return answer
