"""The OpenAPI schema, its docs page (with its files served here, not from a CDN) and the admin."""

from __future__ import annotations

import re
from typing import Any

import yaml
from django.contrib.auth.models import User
from django.test import Client
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator

CUTOUT = "/v1/cutout/{collection}/{experiment}/{channel}/{resolution}/{x}/{y}/{z}/"
BINARY = {"type": "string", "format": "binary"}
ERROR = {"$ref": "#/components/schemas/Error"}


def served_schema() -> dict[str, Any]:
    r = Client().get("/api/schema/")
    assert r.status_code == 200
    return yaml.safe_load(r.content)  # type: ignore[no-any-return]


def test_the_schema_is_openapi_3_and_lists_the_routes(db: Any) -> None:
    schema = served_schema()
    assert schema["openapi"].startswith("3.")
    paths = set(schema["paths"])
    for needed in ("/v1/collection/{name}/", "/v1/cutout/{collection}/{experiment}/{channel}/{resolution}/{x}/{y}/{z}/",
                   "/v1/image/{collection}/{experiment}/{channel}/xy/{resolution}/{x}/{y}/{z}/",
                   "/v1/ingest/", "/v1/downsample/{collection}/{experiment}/{channel}/"):
        assert needed in paths, needed


def test_every_view_is_described_without_a_warning_or_an_error() -> None:
    """drf-spectacular warns where it guesses (no serializer, an unknown authenticator, a path
    parameter's type, two operations with one id): each such guess is a view described untruly."""
    with GENERATOR_STATS.silence():
        SchemaGenerator().get_schema(request=None, public=True)  # resets the counts first
        warnings, errors = dict(GENERATOR_STATS._warn_cache), dict(GENERATOR_STATS._error_cache)
    assert not warnings and not errors, "\n".join([*warnings, *errors])


def test_a_cutout_read_is_binary_in_each_wire_format_and_its_refusals_json(db: Any) -> None:
    schema = served_schema()
    read = schema["paths"][CUTOUT]["get"]
    ok = read["responses"]["200"]["content"]
    assert set(ok) == {"application/blosc", "application/blosc-python", "application/npygz", "application/octet-stream",
                       "image/jpeg", "image/png"}
    assert ok["application/octet-stream"]["schema"] == BINARY
    for code in ("400", "401", "403", "404", "413", "503"):
        assert read["responses"][code]["content"] == {"application/json": {"schema": ERROR}}, code
    parameters = {p["name"]: p for p in read["parameters"]}
    assert parameters["x"]["in"] == "path"
    assert parameters["x"]["schema"]["pattern"] == r"^-?[0-9]{1,12}:-?[0-9]{1,12}$"
    assert parameters["resolution"]["schema"]["type"] == "integer"
    assert parameters["access-mode"]["in"] == "query"
    write = schema["paths"][CUTOUT]["post"]
    assert write["requestBody"]["content"]["application/blosc"]["schema"] == BINARY
    assert "content" not in write["responses"]["201"]  # an empty body
    assert write["responses"]["415"]["content"]["application/json"]["schema"] == ERROR


def test_a_collection_create_reads_its_fields_and_answers_the_collection(db: Any) -> None:
    schema = served_schema()
    create = schema["paths"]["/v1/collection/{name}/"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    fields = schema["components"]["schemas"][body]["properties"]
    assert set(fields) == {"description", "public"}  # the name is the URL's; creator and experiments are read-only
    assert fields["public"]["type"] == "boolean"
    created = create["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    collection = schema["components"]["schemas"][created.rsplit("/", 1)[1]]["properties"]
    assert {"name", "description", "public", "experiments", "creator"} <= set(collection)
    assert create["responses"]["409"]["content"]["application/json"]["schema"] == ERROR
    assert create["security"] == [{"TokenAuth": []}]  # a change needs a token; a read of a public collection none
    assert {"TokenAuth": []} in schema["paths"]["/v1/collection/{name}/"]["get"]["security"]
    assert {} in schema["paths"]["/v1/collection/{name}/"]["get"]["security"]


def test_the_error_body_described_is_the_one_served(admin: Any) -> None:
    schema = served_schema()
    error = schema["components"]["schemas"]["Error"]
    assert error["properties"]["status"]["type"] == "integer" and error["properties"]["message"]["type"] == "string"
    assert set(error["required"]) == {"status", "message"}
    for refused in (admin.get("/v1/collection/nothing-here/"), admin.get("/v1/cutout/nothing/e/c/0/0:1/0:1/0:1/")):
        assert refused["Content-Type"] == "application/json"
        assert set(refused.json()) == set(error["properties"]), refused.content
        assert refused.json()["status"] == refused.status_code == 404


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
