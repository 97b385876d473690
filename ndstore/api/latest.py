"""`/latest/...` is `/v1/...`: the Boss serves its API under both (an nginx rewrite there), and
Neuroglancer's boss datasource and older scripts use `/latest/`. The path is rewritten before
anything else looks at it, so every check (the gate, the budget, the audit row, the routes)
treats the two alike."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

ALIAS, CANONICAL = "/latest/", "/v1/"


class LatestIsV1:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(ALIAS):
            mount = request.path[:len(request.path) - len(request.path_info)]  # SCRIPT_NAME, if any
            request.path_info = CANONICAL + request.path_info[len(ALIAS):]
            request.path = mount + request.path_info
            request.META["PATH_INFO"] = request.path_info
        return self.get_response(request)
