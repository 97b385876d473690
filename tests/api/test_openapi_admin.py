"""The OpenAPI schema, its docs page (with its files served here, not from a CDN) and the admin."""

from __future__ import annotations

import re
from typing import Any

import yaml
from django.contrib.auth.models import User
from django.test import Client


def test_the_schema_is_openapi_3_and_lists_the_routes(db: Any) -> None:
    r = Client().get("/api/schema/")
    assert r.status_code == 200
    schema = yaml.safe_load(r.content)
    assert schema["openapi"].startswith("3.")
    paths = set(schema["paths"])
    for needed in ("/v1/collection/{name}/", "/v1/cutout/{collection}/{experiment}/{channel}/{resolution}/{x}/{y}/{z}/",
                   "/v1/image/{collection}/{experiment}/{channel}/xy/{resolution}/{x}/{y}/{z}/",
                   "/v1/ingest/", "/v1/downsample/{collection}/{experiment}/{channel}/"):
        assert needed in paths, needed


def test_the_docs_page_and_its_files_are_served_here(db: Any) -> None:
    client = Client()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert any("swagger-ui" in a for a in assets), html[:500]
    for asset in assets:
        got = client.get(asset)
        assert got.status_code == 200, asset
        b"".join(got.streaming_content if got.streaming else [got.content])


def test_the_admin_lists_every_resource_model(db: Any) -> None:
    client = Client()
    assert client.get("/admin/").status_code == 302  # to the login page
    client.force_login(User.objects.create(username="boss", is_staff=True, is_superuser=True))
    for model in ("coordinateframe", "collection", "experiment", "channel", "apitoken", "grant"):
        assert client.get(f"/admin/ndstore/{model}/").status_code == 200, model
        assert client.get(f"/admin/ndstore/{model}/add/").status_code == 200, model
    css = client.get("/static/admin/css/base.css")
    assert css.status_code == 200
