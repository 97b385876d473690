"""HTTP caching of files a viewer fetches again and again (slice images, precomputed chunks)."""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpResponse
from django.utils.cache import get_conditional_response

# Voxels can be rewritten at any time: a viewer may keep a file this long without asking again.
MAX_AGE_S = 30


def cacheable(request: Any, body: bytes, content_type: str, public: bool, vary: str) -> HttpResponse:
    """The file with an ETag (a hash of its bytes) that answers a matching If-None-Match with
    304, and a short max-age; shared caches may keep it only when its collection is public."""
    etag = f'"{hashlib.blake2b(body, digest_size=16).hexdigest()}"'
    response = HttpResponse(body, content_type=content_type)
    response["ETag"] = etag
    response["Vary"] = vary
    response["Cache-Control"] = f"{'public' if public else 'private'}, max-age={MAX_AGE_S}"
    django_request = getattr(request, "_request", request)  # DRF wraps Django's request
    conditional: HttpResponse = get_conditional_response(django_request, etag=etag, response=response)
    return conditional
