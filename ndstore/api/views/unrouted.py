"""Any /v1/ path no route matches: a JSON answer that names the problem, never Django's HTML 404.

A path segment that is neither a resource name, an integer nor an `a:b` range is the likely
culprit (a name with `..`, a NUL, a non-ASCII letter, 65 characters): that is a 400 naming the
segment and the rule. Otherwise the path has a shape the API does not know: a 404 saying so.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api.converters import NameConverter, RangeConverter
from ndstore.api.models import NAME_RULE
from ndstore.core.errors import InvalidRequest, NotFound

_SEGMENT = re.compile(rf"(?:{NameConverter.regex}|-?\d+|{RangeConverter.regex})\Z")


class Unrouted(APIView):
    schema = None  # not an operation of the API: left out of /api/schema/

    def _refuse(self, request: Any, *args: Any, **kwargs: Any) -> Response:
        segments = request.path.strip("/").split("/")[1:]  # after "v1"
        for segment in segments:
            if not _SEGMENT.match(segment):
                raise InvalidRequest(f"invalid name {segment!r} in {request.path!r}: {NAME_RULE}")
        raise NotFound(f"no {request.method} route for {request.path!r}; the API is described at /api/docs/")

    get = post = put = patch = delete = head = _refuse
