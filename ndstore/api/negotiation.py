"""Content negotiation: bodies are parsed only in the exact media type a parser speaks, and
`?format=` asking for what a view cannot answer is named.

DRF's default picks a parser whose type *matches* the request's Content-Type, wildcards
included: a grant sent as `application/*` was parsed as JSON (and its audit row lost the body).
Here the Content-Type must name the parser's type itself (parameters aside), or 415.
DRF's default raises a bare 404 ("not found") for an unknown `?format=`: the client cannot tell a
missing resource from a misspelt format. This answers 400 with the formats the view offers.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation

from ndstore.core.errors import InvalidRequest


class NamedFormatNegotiation(DefaultContentNegotiation):
    def select_parser(self, request: Any, parsers: list[Any]) -> Any:
        media_type = (request.content_type or "").split(";")[0].strip().lower()
        return next((parser for parser in parsers if parser.media_type == media_type), None)

    def filter_renderers(self, renderers: list[Any], format: str) -> list[Any]:  # noqa: A002 - DRF's signature
        matching = [renderer for renderer in renderers if renderer.format == format]
        if not matching:
            offered = ", ".join(sorted({renderer.format for renderer in renderers}))
            raise InvalidRequest(f"unknown format {format!r}: this endpoint answers {offered}")
        return matching
