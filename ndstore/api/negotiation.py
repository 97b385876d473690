"""Content negotiation that names the problem when `?format=` asks for what a view cannot answer.

DRF's default raises a bare 404 ("not found") for an unknown `?format=`: the client cannot tell a
missing resource from a misspelt format. This answers 400 with the formats the view offers.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation

from ndstore.core.errors import InvalidRequest


class NamedFormatNegotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: list[Any], format: str) -> list[Any]:
        matching = [renderer for renderer in renderers if renderer.format == format]
        if not matching:
            offered = ", ".join(sorted({renderer.format for renderer in renderers}))
            raise InvalidRequest(f"unknown format {format!r}: this endpoint answers {offered}")
        return matching
