"""URL path converters: resource names and half-open `a:b` ranges, parsed once at the edge."""

from __future__ import annotations

from django.urls import register_converter

from ndstore.api.models import NAME_PATTERN


class NameConverter:
    regex = NAME_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class RangeConverter:
    """`a:b` -> (a, b). Emptiness and order are checked by the geometry, with a clear 400.
    ASCII digits only, as Django's `int` converter: `\\d` also matches other scripts' digits,
    which int() reads ('٣' is 3), so one box had many URLs."""

    regex = r"-?[0-9]{1,12}:-?[0-9]{1,12}"

    def to_python(self, value: str) -> tuple[int, int]:
        a, b = value.split(":")
        return int(a), int(b)

    def to_url(self, value: tuple[int, int]) -> str:
        return f"{value[0]}:{value[1]}"


register_converter(NameConverter, "name")
register_converter(RangeConverter, "range")
