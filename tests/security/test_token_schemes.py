"""A token may come as `Bearer` or as the password of HTTP Basic (ndstore/api/auth.py), as an
attacker meets it: every spelling is checked before a byte of a body is read, a malformed one is
a 401 that names the accepted forms (never a 500), the user name of Basic grants nothing, and no
answer asks a browser for Basic credentials."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ndstore.api.models import Collection, Grant
from tests.api.conftest import Dataset
from tests.security.conftest import CountingBody, token_for, wsgi

BIG = 64 << 20


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def cutout(ds: Dataset) -> str:
    return f"/v1/cutout/{ds.collection}/{ds.experiment}/img8/0/0:512/0:512/0:16/"


@pytest.mark.django_db
@pytest.mark.parametrize("spelling", ["bearer", "basic", "basic naming the admin", "basic, malformed", "digest"])
def test_a_write_without_the_grant_reads_no_byte_of_its_body_however_the_token_is_spelled(
        dataset: Dataset, spelling: str) -> None:
    reader, key = token_for("reader")
    Grant.objects.create(user=reader, collection=Collection.objects.get(name=dataset.collection), level="read")
    header = {"bearer": f"Bearer {key}", "basic": basic("reader", key), "basic naming the admin": basic("admin", key),
              "basic, malformed": "Basic %%%", "digest": f"Digest {key}"}[spelling]
    body = CountingBody(BIG)
    answer = wsgi("POST", cutout(dataset), body, content_type="application/blosc",
                  extra={"HTTP_AUTHORIZATION": header})
    assert answer.status == (401 if spelling in ("basic, malformed", "digest") else 403), answer.body
    assert answer.read_when_answered == 0


@pytest.mark.django_db
@pytest.mark.parametrize("header", [
    "Basic " + "A" * 8000, "Basic " + base64.b64encode(b"\x00" * 3000).decode(), "Bearer " + "x" * 8000,
    "Basic " + base64.b64encode(b"u:" + b"\xc3" * 10).decode(), "Basic =", "Basic  ", "bAsIc Og==",
])
def test_hostile_credentials_are_a_401_naming_the_forms(dataset: Dataset, header: str) -> None:
    answer: Any = wsgi("GET", cutout(dataset), extra={"HTTP_AUTHORIZATION": header})
    assert answer.status == 401, answer.body
    message = answer.json()["message"]
    assert any(said in message for said in ("'Token <key>'", "invalid or revoked", "the token is the password"))


@pytest.mark.django_db
def test_a_refusal_never_asks_the_browser_for_basic_credentials(dataset: Dataset) -> None:
    from django.core.handlers.wsgi import WSGIHandler

    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            seen.update(dict(headers))
            return start_response(status, headers, exc_info)
        return WSGIHandler()(environ, keep)

    answer = wsgi("GET", cutout(dataset), extra={"HTTP_AUTHORIZATION": basic("u", "wrong")}, app=app)
    assert answer.status == 401 and seen.get("WWW-Authenticate") == "Token"
