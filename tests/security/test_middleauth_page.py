"""The middleauth+ login page (ndstore/api/views/middleauth.py) as an attacker meets it: it runs
only its own script (the Content-Security-Policy names that script's hash), cannot be framed
(clickjacking a token out of a user), keeps no copy in caches, names its allowed origins from
the server's own host and settings only, and a Host header that would write into the page is
refused. tests/viewer/test_middleauth_login.py checks in Chromium that an opener of any other
origin is handed nothing."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.security.conftest import strict_page_policy


@pytest.mark.django_db
def test_the_login_page_runs_only_its_own_script_and_is_never_framed_or_kept() -> None:
    csp, _ = strict_page_policy(Client().get("/api/v1/authorize"))
    assert "connect-src 'self'" in csp  # it checks the token against this server, and only this one


@pytest.mark.django_db
def test_the_allowed_origins_come_from_the_host_and_settings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NDSTORE_NEUROGLANCER_ORIGINS", "https://viewer.example, ")
    page = Client().get("/api/v1/authorize?origin=https://evil.example", HTTP_HOST="data.example")
    listed = re.search(r'<script id="origins" type="application/json">(.*?)</script>', page.content.decode())
    assert listed is not None and listed.group(1) == '["http://data.example", "https://viewer.example"]'
    for hostile in ('evil.example"></script><script>alert(1)</script>', "evil.example/path", "a b"):
        assert Client().get("/api/v1/authorize", HTTP_HOST=hostile).status_code == 400, hostile


@pytest.mark.django_db
def test_auth_info_names_this_server_and_nothing_else() -> None:
    info = Client().get("/auth_info", HTTP_HOST="data.example")
    assert info.status_code == 200 and info.json() == {"login_url": "http://data.example"}
    assert info["Access-Control-Allow-Origin"] == "*"  # Neuroglancer on another origin reads it
    assert Client().post("/auth_info").status_code in (401, 405)  # the gate refuses an anonymous POST first
