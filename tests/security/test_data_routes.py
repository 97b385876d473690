"""The data routes' short path (ndstore/api/data_routes.py), as an attacker meets it: it reads no
byte of a body before the caller is known and may write, opens no method a view does not take,
serves only views that say how they read and write, and cannot be reached by spelling a path
another way. tests/api/test_data_routes.py checks the answers equal the framework's."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import path

from ndstore.api import data_routes, urls
from ndstore.api.views.boss import IdsView
from tests.api.conftest import Dataset
from tests.security.conftest import CountingBody, token_for, wsgi

BIG = 64 << 20


def cutout(ds: Dataset, tier: str = "") -> str:
    return f"/v1/{tier}cutout/{ds.collection}/{ds.experiment}/img8/0/0:512/0:512/0:16/"


@pytest.mark.django_db
@pytest.mark.parametrize("tier", ["", "direct/", "blaze/"])
@pytest.mark.parametrize("who", ["anonymous", "a bad token", "a read grant"])
def test_a_write_without_the_grant_reads_no_byte_of_its_body(dataset: Dataset, grant: Any, tier: str,
                                                              who: str) -> None:
    token = {"anonymous": None, "a bad token": "forged"}.get(who)
    if who == "a read grant":
        user, token = token_for("reader")
        from ndstore.api.models import Collection, Grant

        Grant.objects.create(user=user, collection=Collection.objects.get(name=dataset.collection), level="read")
    body = CountingBody(BIG)
    answer = wsgi("POST", cutout(dataset, tier), body, token=token, content_type="application/blosc")
    assert answer.status == (403 if who == "a read grant" else 401), answer.body
    assert answer.read_when_answered == 0


@pytest.mark.django_db
def test_a_body_past_the_limit_is_refused_unread(dataset: Dataset) -> None:
    _, token = token_for("superuser", is_superuser=True)
    body = CountingBody(1 << 40)
    answer = wsgi("POST", cutout(dataset), body, token=token, content_type="application/blosc")
    assert answer.status == 413 and answer.read_when_answered == 0


@pytest.mark.django_db
@pytest.mark.parametrize("target", [
    "/precomputed/{c}/{e}/img8/info", "/zarr/{c}/{e}/img8/0/c/0/0/0/0", "/v1/image/{c}/{e}/img8/xy/0/0:8/0:8/0/",
])
def test_a_view_that_takes_no_posts_still_refuses_them(dataset: Dataset, target: str) -> None:
    """A POST to a read-only file is DRF's 405, not a write: the short path serves only the
    methods a view has."""
    _, token = token_for("superuser", is_superuser=True)
    answer = wsgi("POST", target.format(c=dataset.collection, e=dataset.experiment), b"x" * 64, token=token,
                  content_type="application/octet-stream")
    assert answer.status == 405


def test_a_view_whose_get_does_not_call_its_own_read_stops_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """IdsView overrides CutoutView's get but inherits its read and write: served short as it is, a
    GET of ids would read the box and a POST would write it. A view on a data route must have its
    get (and post) written beside the read (and write) the short path calls."""
    assert not data_routes.calls_its_own(IdsView, "get", "read")
    monkeypatch.setattr(urls, "data_routes", lambda: [path("v1/ids/<path:rest>", IdsView.as_view())])
    with pytest.raises(ImproperlyConfigured, match="IdsView"):
        data_routes.short_resolver()


def test_every_view_served_short_calls_its_own_read_and_write() -> None:
    views = {route.callback.view_class for route in urls.data_routes()}
    assert len(views) >= 10
    for view in views:
        assert data_routes.calls_its_own(view, "get", "read"), view
        assert not hasattr(view, "post") or data_routes.calls_its_own(view, "post", "write"), view


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", [
    "/v1//cutout/{c}/{e}/img8/0/0:8/0:8/0:1/", "/v1/cutout/{c}/{e}/img8/0/0:8/0:8/0:1//",
    "/v1/cutout/{c}/{e}/img8/0/0:8/0:8/0:1/%2e%2e/", "/v1/cutout/{c}/{e}/img8/0/0:8/0:8/0:1/?",
    "/v1/cutout/{c}/{e}/img8/0/\u0660:8/0:8/0:1/".encode().decode("latin-1"),  # as WSGI hands a UTF-8 path over
])
def test_another_spelling_of_a_path_meets_the_same_checks(dataset: Dataset, spelling: str) -> None:
    """Whatever the short resolver does not match goes through the whole URLconf and its checks:
    an anonymous write is refused unread either way."""
    body = CountingBody(BIG)
    answer = wsgi("POST", spelling.format(c=dataset.collection, e=dataset.experiment), body,
                  content_type="application/blosc")
    assert answer.status == 401 and answer.read_when_answered == 0
