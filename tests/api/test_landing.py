"""The landing page's HTML (no browser): it lists the channels anyone may read with their
datatype, extent and levels, hides private ones, and links each to Neuroglancer with the channel's
precomputed source; `/neuroglancer/` serves the static build, and with none installed the links
fall back to the public Neuroglancer and the page says so."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from django.test import Client
from rest_framework.test import APIClient

from ndstore.api.models import Collection
from ndstore.api.views.landing import PUBLIC_NEUROGLANCER
from tests.api.conftest import make_dataset

LINK = re.compile(r'<a class="neuroglancer" data-channel="([^"]+)" href="([^"]+)"')
ZARR_LINK = re.compile(r'<a class="neuroglancer-zarr" data-channel="([^"]+)" href="([^"]+)"')


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in Neuroglancer build: an index.html and one hashed asset."""
    (tmp_path / "assets").mkdir()
    (tmp_path / "index.html").write_text("<!doctype html><title>neuroglancer</title>")
    (tmp_path / "assets" / "index-abc123.js").write_text("console.log('ng');")
    monkeypatch.setenv("NDSTORE_NEUROGLANCER_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def no_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NDSTORE_NEUROGLANCER_DIR", str(tmp_path / "absent"))


@pytest.fixture
def datasets(admin: APIClient) -> None:
    make_dataset(admin, "open", frame=(1100, 700, 100), levels=3,
                 channels={"img8": "uint8", "img16": "uint16", "ann64": "uint64"})
    make_dataset(admin, "closed", channels={"secret8": "uint8"})
    Collection.objects.filter(name="open").update(public=True)


def links(html: str) -> dict[str, str]:
    """channel path -> the Neuroglancer URL, with HTML entities in the href undone."""
    return {ch: href.replace("&amp;", "&") for ch, href in LINK.findall(html)}


def state_of(url: str) -> dict[str, Any]:
    _, _, fragment = url.partition("#!")
    return json.loads(unquote(fragment))  # type: ignore[no-any-return]


def get_page(**headers: Any) -> str:
    response = Client().get("/", **headers)  # anonymous: no token, as a visitor's browser
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    return response.content.decode()


def test_lists_public_channels_with_datatype_extent_and_levels(datasets: None, bundle: Path) -> None:
    html = get_page()
    assert set(links(html)) == {"open/e1/img8", "open/e1/img16", "open/e1/ann64"}
    row = re.search(r'<tr class="channel" data-channel="open/e1/img16">(.*?)</tr>', html, re.S)
    assert row is not None
    assert '<td class="datatype">uint16</td>' in row.group(1)
    assert "[0, 1100) &times; [0, 700) &times; [0, 100)" in row.group(1)
    assert re.search(r'<td class="levels">3<br>', row.group(1))
    assert 'href="/api/docs/"' in html and 'href="/v1/collection/"' in html


def test_hides_private_collections(datasets: None, bundle: Path) -> None:
    html = get_page()
    assert "closed" not in html and "secret8" not in html


def test_no_public_data_says_so(admin: APIClient, bundle: Path) -> None:
    make_dataset(admin, "closed")
    html = get_page()
    assert 'id="no-datasets"' in html and not links(html)


def test_links_point_the_bundled_viewer_at_the_precomputed_source(datasets: None, bundle: Path) -> None:
    urls = links(get_page(HTTP_HOST="ndstore.example:8080"))
    for path, kind in [("open/e1/img8", "image"), ("open/e1/ann64", "segmentation")]:
        assert urls[path].startswith("http://ndstore.example:8080/neuroglancer/#!")
        (layer,) = state_of(urls[path])["layers"]
        assert layer["source"] == f"precomputed://http://ndstore.example:8080/precomputed/{path}"
        assert layer["type"] == kind
        assert layer["name"] == path.rsplit("/", 1)[1]
    zarr = {ch: href.replace("&amp;", "&") for ch, href in ZARR_LINK.findall(get_page(HTTP_HOST="ndstore.example"))}
    (layer,) = state_of(zarr["open/e1/img8"])["layers"]
    assert layer["source"] == "zarr3://http://ndstore.example/zarr/open/e1/img8"


def test_without_a_bundle_links_open_the_public_viewer(datasets: None, no_bundle: None) -> None:
    html = get_page()
    url = links(html)["open/e1/img8"]
    assert url.startswith(PUBLIC_NEUROGLANCER + "#!")
    assert state_of(url)["layers"][0]["source"] == "precomputed://http://testserver/precomputed/open/e1/img8"
    assert "Neuroglancer is not installed on this server" in html
    assert "deploy/neuroglancer/install.sh" in html


def test_serves_the_bundle_with_content_types(bundle: Path) -> None:
    client = Client()
    index = client.get("/neuroglancer/")
    assert index.status_code == 200 and index["Content-Type"].startswith("text/html")
    assert b"<title>neuroglancer</title>" in b"".join(index.streaming_content)
    assert index["Cache-Control"] == "no-cache"
    asset = client.get("/neuroglancer/assets/index-abc123.js")
    assert asset.status_code == 200 and asset["Content-Type"].startswith("text/javascript")
    assert "immutable" in asset["Cache-Control"]
    assert client.get("/neuroglancer").status_code in (301, 302)
    assert client.get("/neuroglancer/assets/missing.js").status_code == 404
    outside = Client(raise_request_exception=False).get("/neuroglancer/../index.html")
    assert outside.status_code == 400  # Django's SuspiciousFileOperation: never a file outside the build
    assert client.post("/neuroglancer/").status_code == 401  # no state change without a token (ndstore/api/gate.py)


def test_without_a_bundle_the_viewer_path_is_a_404_naming_the_installer(no_bundle: None) -> None:
    response = Client().get("/neuroglancer/")
    assert response.status_code == 404
