"""HTTP caching of files a viewer fetches again and again (slice images, precomputed chunks); the
ETag, If-None-Match and Range are ndstore.api.browser_http's, for every data GET."""

from __future__ import annotations

from django.http import HttpResponse

# Voxels can be rewritten at any time: a viewer may keep a file this long without asking again.
MAX_AGE_S = 30


def cacheable(body: bytes, content_type: str, public: bool, vary: str, revalidate: bool = False) -> HttpResponse:
    """The file with a short max-age, or asked again on every use (`revalidate`: what changes with
    writes that must show at once); shared caches may keep it only when its collection is public."""
    response = HttpResponse(body, content_type=content_type)
    response["Vary"] = vary
    freshness = "no-cache" if revalidate else f"max-age={MAX_AGE_S}"
    response["Cache-Control"] = f"{'public' if public else 'private'}, {freshness}"
    return response
