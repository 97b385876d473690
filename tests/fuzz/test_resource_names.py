"""Path tricks in resource names, through the API: names with '..', '/', '%2F', NUL, unicode,
or too long, in the URL (percent-encoded or not) and in JSON bodies.

Every such request is refused with a 4xx (JSON with a message: a path no route matches gets
one from ndstore.api.views.unrouted), and nothing is created or renamed: the names stored afterwards are exactly those
before, each a valid name. A valid name creates exactly the resource it names, reachable under
that name only.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from ndstore.api.models import NAME_PATTERN, Channel, Collection, CoordinateFrame, Experiment
from tests.api.conftest import admin, make_dataset  # noqa: F401  (a fixture)
from tests.fuzz.test_decoders import SCALE

NAMES = settings(max_examples=int(60 * SCALE), deadline=None, suppress_health_check=list(HealthCheck))
VALID = re.compile(rf"\A{NAME_PATTERN}\Z")  # `$` would let a trailing newline through
VALID_CHARS = "abcXYZ019_-"
TRICKS = ["..", ".", "../c1", "..%2Fc1", "%2e%2e", "c1/..", "c1/../c1", "a/b", "a%2Fb", "a%2fb", "%2F", "/",
          "a\x00b", "\x00", "%00", "a%00", "é", "ｃ１", "c1\u202e", "\u200bc1", "c1 ", " c1", "-c1", "c1.", "💥",
          "a" * 65, "a" * 4096, "c1\\..\\x", "~root", "%252F", "c1;x", "c1\n", "C1%0D%0A"]


def hostile_names() -> st.SearchStrategy[str]:
    valid = st.text(VALID_CHARS, min_size=1, max_size=8).filter(VALID.match)
    joined = st.builds(lambda a, sep, b: a + sep + b, valid,
                       st.sampled_from(["/", "%2F", "..", "/../", "\x00", "%00", "\\", " ", ".", "%"]), valid)
    return st.one_of(st.sampled_from(TRICKS), joined, st.text(min_size=1, max_size=70),
                     st.text(VALID_CHARS, min_size=65, max_size=300))


# kind -> URL of a name in the dataset's hierarchy, and a body that would create it
ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "coord": ("/v1/coord/{}/", {"x_stop": 10, "y_stop": 10, "z_stop": 10}),
    "collection": ("/v1/collection/{}/", {"description": "x"}),
    "experiment": ("/v1/collection/c1/experiment/{}/", {"coord_frame": "c1_frame", "num_hierarchy_levels": 1}),
    "channel": ("/v1/collection/c1/experiment/e1/channel/{}/", {"type": "image", "datatype": "uint8"}),
}


def stored_names() -> dict[str, list[str]]:
    return {model.__name__: sorted(model.objects.values_list("name", flat=True))
            for model in (CoordinateFrame, Collection, Experiment, Channel)}


def _url(template: str, name: str, encoding: str, trailing_slash: bool) -> str:
    segment = quote(name, safe="") if encoding == "quoted" else name
    url = template.format(segment)
    return url if trailing_slash else url[:-1]


def _decoded(name: str, encoding: str) -> str:
    """The name as the service sees it: WSGI servers percent-decode the path (and urllib drops
    a raw tab, CR or LF from a URL before it is sent)."""
    return name if encoding == "quoted" else unquote(re.sub("[\t\r\n]", "", name))


def assert_refused(response: Any, what: str) -> None:
    assert 400 <= response.status_code < 500, (what, response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), (what, response.content[:300])
    assert response.json()["message"], what


@pytest.fixture
def names_dataset(wired: None, admin: APIClient) -> APIClient:  # noqa: F811
    make_dataset(admin, name="c1", frame=(64, 64, 16), channels={"img8": "uint8"})
    return admin


@NAMES
@given(name=hostile_names(), kind=st.sampled_from(sorted(ROUTES)), encoding=st.sampled_from(["quoted", "raw"]),
       trailing_slash=st.booleans())
def test_hostile_names_in_the_url_create_nothing(names_dataset: APIClient, name: str, kind: str, encoding: str,
                                                 trailing_slash: bool) -> None:
    decoded = _decoded(name, encoding)
    assume(not VALID.match(decoded))
    # without the URL's own trailing slash, a name that ends in one ("0/", "0%2F" raw) supplies
    # it: the URL then names "0", a valid name, and creating it is no trick
    assume(trailing_slash or not VALID.match(decoded.removesuffix("/")))
    # A raw '?' or '#' ends the path; a decoded '/experiment/' or '/channel/' names another
    # route (WSGI servers hand the application a decoded path): neither is a trick of the name.
    assume(encoding == "quoted" or not set(name) & {"?", "#"})
    assume("/experiment/" not in f"/{decoded}/" and "/channel/" not in f"/{decoded}/")
    template, body = ROUTES[kind]
    before = stored_names()
    url = _url(template, name, encoding, trailing_slash)
    assert_refused(names_dataset.post(url, body, format="json"), f"POST {url!r}")
    assert_refused(names_dataset.put(url, {"description": "renamed?"}, format="json"), f"PUT {url!r}")
    assert stored_names() == before


@NAMES
@given(name=hostile_names(), kind=st.sampled_from(["collection", "experiment", "channel", "coord"]))
def test_hostile_names_in_bodies_neither_create_nor_rename(names_dataset: APIClient, name: str, kind: str) -> None:
    assume(not VALID.match(name))
    existing = {"coord": "c1_frame", "collection": "c1", "experiment": "e1", "channel": "img8"}[kind]
    template, body = ROUTES[kind]
    before = stored_names()
    r = names_dataset.put(template.format(existing), {"name": name}, format="json")
    assert_refused(r, f"rename {kind} to {name!r}")
    r = names_dataset.post(template.format("fresh"), {**body, "name": name}, format="json")
    if r.status_code == 201:  # the URL names the resource; a name in the body is ignored
        assert r.json()["name"] == "fresh"
        assert names_dataset.delete(template.format("fresh")).status_code == 204
    else:
        assert_refused(r, f"create with a body naming {name!r}")
    references: dict[str, dict[str, Any]] = {"experiment": {"coord_frame": name}, "channel": {"sources": [name]}}
    if kind in references:
        assert_refused(names_dataset.post(template.format("fresh2"), {**body, **references[kind]}, format="json"),
                       f"{kind} referring to {name!r}")
    assert stored_names() == before


@NAMES
@given(name=st.text(VALID_CHARS, min_size=1, max_size=64).filter(VALID.match),
       kind=st.sampled_from(sorted(ROUTES)))
def test_a_valid_name_creates_exactly_what_it_names(names_dataset: APIClient, name: str, kind: str) -> None:
    template, body = ROUTES[kind]
    existing = {"coord": "c1_frame", "collection": "c1", "experiment": "e1", "channel": "img8"}[kind]
    assume(name != existing)
    before = stored_names()
    r = names_dataset.post(template.format(name), body, format="json")
    try:
        assert r.status_code == 201, r.content
        model = {"coord": "CoordinateFrame", "collection": "Collection", "experiment": "Experiment",
                 "channel": "Channel"}[kind]
        assert stored_names()[model] == sorted([*before[model], name])
        assert names_dataset.get(template.format(name)).json()["name"] == name
        for other in {name.upper(), name.lower(), name + "_", "_" + name} - {name, *before[model]}:
            if VALID.match(other):
                assert names_dataset.get(template.format(other)).status_code == 404, other
    finally:  # hypothesis replays failures: leave nothing behind for the next example
        names_dataset.delete(template.format(name))
    assert stored_names() == before


@pytest.mark.parametrize("name", ["..", "a\x00b", "é", "a" * 65, "c1\n", "c1 "])
def test_a_hostile_name_gets_a_json_400_naming_the_rule(names_dataset: APIClient, name: str) -> None:
    r = names_dataset.post(f"/v1/collection/{quote(name, safe='')}/", {"description": "x"}, format="json")
    assert r.status_code == 400, r.content
    assert "names are" in r.json()["message"] and repr(name) in r.json()["message"]


def test_a_path_of_no_known_shape_gets_a_json_404_saying_so(names_dataset: APIClient) -> None:
    r = names_dataset.post("/v1/collection/a%2Fb/", {"description": "x"}, format="json")  # decoded: a/b
    assert r.status_code == 404 and r.json()["message"] == "no POST route for '/v1/collection/a/b/'; " \
        "the API is described at /api/docs/"


@pytest.mark.parametrize("name", ["c1\n", "c1\r\n", "\nc1"])
def test_the_stored_name_rule_refuses_line_breaks(name: str) -> None:
    from django.core.exceptions import ValidationError

    from ndstore.api.models import name_validator

    with pytest.raises(ValidationError, match="names are"):
        name_validator(name)
