"""Browser-grade HTTP on every data GET (cutouts of every tier, ids, slice images, the
precomputed and zarr views): what a viewer running on another origin, or a sharded reader, needs.

- CORS on every answer of these routes, errors included, and a preflight (OPTIONS with
  Access-Control-Request-Method) answered 204 for reads. Cross-origin writes are not opened:
  a browser may read here from any origin, with a token header and never with cookies (`*`).
- A strong ETag on every 200: a hash of the very bytes sent, so a write that changes a voxel
  changes the ETag of every view of it at once. If-None-Match -> 304, If-Match -> 412.
- `Range: bytes=a-b` (one range; `a-` and `-n` too) -> 206 with Content-Range, or 416 with
  `Content-Range: bytes */length` when it starts past the end. JSON documents (info, zarr.json)
  are always sent whole (a part of one is not JSON; RFC 9110 lets a server ignore Range). Several
  ranges, or a malformed header, are ignored (200 with the whole body), as RFC 9110 allows; If-Range that names another
  ETag asks for the whole body. Nothing here compresses a body on the fly.
- HEAD answers GET's headers (Content-Length of the whole body) with no body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import blake3
from django.http import HttpRequest, HttpResponse
from django.utils.cache import get_conditional_response

DATA_PREFIXES = ("/v1/cutout/", "/v1/direct/cutout/", "/v1/blaze/cutout/", "/v1/ids/", "/v1/image/",
                 "/precomputed/", "/precomputed-sharded/", "/zarr/", "/precomputed-annotations/")
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "Content-Range, Content-Length, Content-Encoding, Content-Type, ETag, "
                                     "Cache-Control, Accept-Ranges",
}
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Range, If-None-Match, If-Range, Cache-Control",
    "Access-Control-Max-Age": "86400",
}
_ONE_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")


def is_data_path(path: str) -> bool:
    return path.startswith(DATA_PREFIXES)


def strong_etag(body: bytes) -> str:
    """128 bits of BLAKE3 of the body: cryptographic (a writer cannot craft another body with the
    same ETag to hide a change from a reader's If-None-Match), and ~5 GB/s on one core here where
    SHA-256 does 2: the hash was a fifth of the server's time on a 16 MiB read
    (docs/design/standard-views.md)."""
    return f'"{blake3.blake3(body).hexdigest(16)}"'


def preflight() -> HttpResponse:
    response = HttpResponse(status=204, headers=PREFLIGHT_HEADERS)
    return with_cors(response)


def with_cors(response: HttpResponse) -> HttpResponse:
    for name, value in CORS_HEADERS.items():
        response[name] = value
    return response


def byte_range(header: str, length: int) -> tuple[int, int] | None | str:
    """(first, last) inclusive for one satisfiable range; "unsatisfiable"; or None: answer the
    whole body (no header, several ranges, or a header that does not parse)."""
    match = _ONE_RANGE.fullmatch(header.strip().replace(" ", ""))
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last n bytes
        n = int(last)
        if n == 0 or length == 0:
            return "unsatisfiable"
        return max(0, length - n), length - 1
    start = int(first)
    stop = int(last) if last else length - 1
    if last and stop < start:
        return None  # invalid: ignored
    if start >= length:
        return "unsatisfiable"
    return start, min(stop, length - 1)


class BrowserHTTP:
    """Middleware, innermost: it sees the view's rendered response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not is_data_path(request.path):
            return self.get_response(request)
        if request.method == "OPTIONS" and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in request.META:
            return preflight()
        response = with_cors(self.get_response(request))
        if request.method not in ("GET", "HEAD") or response.status_code != 200 or response.streaming:
            return response
        return self._conditional(request, response)

    @staticmethod
    def _conditional(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        body = response.content
        if not response.has_header("ETag"):
            response["ETag"] = strong_etag(body)
        if not response.has_header("Cache-Control"):
            response["Cache-Control"] = "private, no-cache"  # keep it, but ask again: the ETag answers cheaply
        json_document = response.get("Content-Type", "").startswith("application/json")
        response["Accept-Ranges"] = "none" if json_document else "bytes"
        answer: HttpResponse = with_cors(get_conditional_response(request, etag=response["ETag"], response=response))
        if answer is response and not json_document:  # a part of a JSON document is no JSON: sent whole
            answer = _ranged(request, response, body)
        if request.method == "HEAD" and answer.status_code in (200, 206):
            answer["Content-Length"] = str(len(answer.content))
            answer.content = b""
        return answer


def unsatisfiable(header: str, length: int) -> HttpResponse:
    message = f"range {header[:64]!r} starts past the end of the {length}-byte body"
    refused = HttpResponse(json.dumps({"status": 416, "message": message}), status=416,
                           content_type="application/json")
    refused["Content-Range"] = f"bytes */{length}"
    return with_cors(refused)


def _ranged(request: HttpRequest, response: HttpResponse, body: bytes) -> HttpResponse:
    header = request.META.get("HTTP_RANGE")
    if not header:
        return response
    if_range = request.META.get("HTTP_IF_RANGE")
    if if_range is not None and if_range.strip() != response["ETag"]:
        return response  # the client's copy is another version: the whole body
    wanted = byte_range(header, len(body))
    if wanted is None:
        return response
    if wanted == "unsatisfiable":
        return unsatisfiable(header, len(body))
    first, last = wanted  # type: ignore[misc]
    response.status_code = 206
    response.content = body[first:last + 1]
    response["Content-Range"] = f"bytes {first}-{last}/{len(body)}"
    return response
