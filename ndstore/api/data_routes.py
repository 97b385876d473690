"""The data routes' short path: GETs, HEADs and POSTs of the cutout routes of every tier, and the
GETs and HEADs of the slice images and of the standard views' files (precomputed, sharded, zarr;
urls.data_routes) are served without Django's URL resolver over every route, without the
middleware that only the control plane and the admin need, and without DRF's generic dispatch.

What stays is everything that decides what a request may do and what it is answered: the
middleware after this one in settings.MIDDLEWARE but those named in NOT_ON_DATA_ROUTES (the
gate, the metadata generation, browser HTTP, Django's security and common middleware, each
wrapped as Django wraps it), the token authentication, the anonymous read throttle, DRF's
content negotiation, the views' own read and write (the same methods DRF's dispatch calls), the
exception handler and DRF's rendering, with the headers DRF's dispatch adds (Allow, Vary).
What a request is answered does not depend on the path it took: tests/api/test_data_routes.py
sends the same requests both ways and compares the answers byte for byte.

Why: outside the view, a small request spent 40-55% of its thread's CPU, about half of it on
parts the data routes do not need; skipping them saves 6-16% of a small cutout's web CPU
(docs/design/serving.md, "The data routes' own dispatch"). Any other method (OPTIONS, PUT, ...) and any path the
short resolver does not match go on to Django as before. NDSTORE_LEAN_DATA_ROUTES=0 turns the
short path off (the benchmarks measure what the framework costs with it). A method a view does
not take (a POST to a file of a standard view) goes to the framework, which answers 405.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponse
from django.urls import URLResolver
from django.urls.exceptions import Resolver404
from django.urls.resolvers import RegexPattern
from django.utils.cache import cc_delim_re, patch_vary_headers
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api.auth import TokenAuthentication

METHODS = frozenset({"GET", "HEAD", "POST"})
THIS = "ndstore.api.data_routes.DataRoutes"
# Middleware of settings.MIDDLEWARE that the data routes do without, and why.
NOT_ON_DATA_ROUTES = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves /static/ only",
    "django.contrib.sessions.middleware.SessionMiddleware": "data routes authenticate by token, never by session",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "the same: request.user is the token's user",
    "django.contrib.messages.middleware.MessageMiddleware": "the admin's messages",
    "ndstore.api.audit.AuditMiddleware": "audits the control plane only (audit.audited: no data route)",
}


def short_resolver() -> URLResolver:
    """A resolver over the data routes alone (the patterns urls.py routes, so the URLs are defined
    once); paths it does not match go through the whole URLconf. Each of their views reads in
    `read(request, kw)` and, if it takes POSTs, writes in `write(request, kw, body)`: what its
    get and post call, and what `serve` calls."""
    from ndstore.api import urls

    routes = urls.data_routes()
    for route in routes:
        view = route.callback.view_class
        writes = hasattr(view, "post")
        if not calls_its_own(view, "get", "read") or (writes and not calls_its_own(view, "post", "write")):
            raise ImproperlyConfigured(f"{view.__name__} is on a data route but its get/post do not call a read/write "
                                       "written beside them")
    return URLResolver(RegexPattern(r"^/"), routes)


def calls_its_own(view: type, handler: str, body: str) -> bool:
    """Whether ``view``'s handler (get, post) and the body it calls (read, write) were written in
    one class: a subclass that overrides get but inherits read (as IdsView does CutoutView's)
    would be served the parent's read here. drf-spectacular wraps inherited handlers it describes."""
    method, called = getattr(view, handler, None), getattr(view, body, None)
    if method is None or called is None:
        return False
    return bool(inspect.unwrap(method).__qualname__.rsplit(".", 1)[0] == called.__qualname__.rsplit(".", 1)[0])


def handled(request: HttpRequest, view: type[APIView]) -> bool:
    """Whether the view answers this method itself (else DRF's 405, through the framework)."""
    name = "get" if request.method == "HEAD" else (request.method or "").lower()
    return name in view.http_method_names and hasattr(view, name)


class DataRoutes:
    """Middleware, right after LatestIsV1 and Operations (the path rewrite, the log line and the
    metrics apply to every request)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.resolver = short_resolver()
        self.short = self._chain()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in METHODS or not settings.NDSTORE_LEAN_DATA_ROUTES:
            return self.get_response(request)
        try:
            match = self.resolver.resolve(request.path_info)
        except Resolver404:
            return self.get_response(request)
        if not handled(request, match.func.view_class):  # type: ignore[attr-defined]
            return self.get_response(request)
        request.resolver_match = match
        return self.short(request)

    def _chain(self) -> Callable[[HttpRequest], HttpResponse]:
        """The middleware after this one, less NOT_ON_DATA_ROUTES, around `serve`, each wrapped
        as Django's handler wraps it (an exception becomes the answer Django would give)."""
        after = list(settings.MIDDLEWARE)[list(settings.MIDDLEWARE).index(THIS) + 1:]
        handler = convert_exception_to_response(serve)
        for path in reversed([path for path in after if path not in NOT_ON_DATA_ROUTES]):
            handler = convert_exception_to_response(import_string(path)(handler))
        return handler


class _AsDRF:
    """What DRF's negotiation and parser selection read of a request."""

    def __init__(self, request: HttpRequest):
        self.query_params, self.META, self.headers = request.GET, request.META, request.headers
        self.content_type = request.META.get("CONTENT_TYPE", request.META.get("HTTP_CONTENT_TYPE", ""))


def serve(request: HttpRequest) -> HttpResponse:
    """The resolved view's read or write, dispatched as DRF's APIView.dispatch does it: content
    negotiation, authentication, permissions, throttles, then the handler; an exception becomes
    the answer the view's exception handler gives."""
    match = request.resolver_match
    assert match is not None
    view: Any = match.func.view_class(**match.func.view_initkwargs)  # type: ignore[attr-defined]
    view.setup(request, *match.args, **match.kwargs)
    view.headers = dict(view.default_response_headers)
    view.format_kwarg = None
    try:
        response = _dispatch(view, request, match.kwargs)
    except Exception as exc:  # noqa: BLE001 - answered as DRF answers it, or raised on to Django
        response = _refusal(view, request, exc)
    return _finalized(view, request, response)


def _dispatch(view: APIView, request: Any, kw: dict[str, Any]) -> HttpResponse:
    renderers = view.get_renderers()
    request.accepted_renderer, request.accepted_media_type = view.get_content_negotiator().select_renderer(
        _AsDRF(request), renderers, None)
    _authenticate(request)
    view.check_permissions(request)  # none on these views today; a view that sets some keeps them here
    view.check_throttles(request)
    if request.method == "POST":
        return view.write(request, kw, lambda: _parsed(view, request, kw))  # type: ignore[attr-defined, no-any-return]
    return view.read(request, kw)  # type: ignore[attr-defined, no-any-return]


def _authenticate(request: Any) -> None:
    """request.user and request.auth as DRF's Request sets them (AnonymousUser without a token)."""
    try:
        identity = TokenAuthentication().authenticate(request)
    except exceptions.APIException:
        request.user, request.auth = AnonymousUser(), None
        raise
    request.user, request.auth = identity if identity is not None else (AnonymousUser(), None)


def _parsed(view: APIView, request: HttpRequest, kw: dict[str, Any]) -> Any:
    """The body as DRF's Request.data parses it: nothing declared, nothing read ({}); a body in a
    media type no parser of the view speaks exactly, 415."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except (ValueError, TypeError):
        declared = 0
    if declared == 0:
        return {}
    shown = _AsDRF(request)
    parser = view.get_content_negotiator().select_parser(shown, view.get_parsers())
    if parser is None:
        raise exceptions.UnsupportedMediaType(shown.content_type)
    context = {"view": view, "args": (), "kwargs": kw, "request": request, "encoding": request.encoding}
    return parser.parse(request, shown.content_type, context)


def _refusal(view: APIView, request: Any, exc: Exception) -> HttpResponse:
    """APIView.handle_exception for the data views, whose refusals are JSON (JSONErrors, or JSON as
    the only renderer of the standard views' errors)."""
    request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        exc.auth_header = TokenAuthentication.keyword  # type: ignore[attr-defined]
    response = view.get_exception_handler()(exc, view.get_exception_handler_context())
    if response is None:
        raise exc
    response.exception = True
    return response  # type: ignore[no-any-return]


def _finalized(view: APIView, request: Any, response: HttpResponse) -> HttpResponse:
    """APIView.finalize_response, then the rendering Django's handler would do."""
    if isinstance(response, Response):
        response.accepted_renderer = request.accepted_renderer
        response.accepted_media_type = request.accepted_media_type
        response.renderer_context = view.get_renderer_context()
    vary = view.headers.pop("Vary", None)
    if vary is not None:
        patch_vary_headers(response, cc_delim_re.split(vary))
    for name, value in view.headers.items():
        response[name] = value
    return response.render() if isinstance(response, Response) else response
