"""Attackers against the browser-grade HTTP of the data GETs and the `/latest/` alias: neither a
Range, an ETag guess, a preflight nor the other prefix reaches data or state the caller may not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core import wire
from tests.api.conftest import make_dataset
from tests.security.conftest import CountingBody, wsgi

BOX = "0:64/0:64/0:4/"


@pytest.fixture
def private(admin: Any) -> dict[str, str]:
    """A private channel holding random voxels; the URLs of its data views and its ETag."""
    make_dataset(admin, name="secret", levels=3)
    values = np.random.default_rng(3).integers(1, 255, (4, 64, 64), dtype=np.uint8)
    url = f"/v1/cutout/secret/e1/img8/0/{BOX}"
    r = admin.generic("POST", url, wire.format_for("application/octet-stream").encode(values),
                      content_type="application/octet-stream")
    assert r.status_code == 201
    whole = admin.get(url, HTTP_ACCEPT="application/octet-stream")
    return {"cutout": url, "precomputed": "/precomputed/secret/e1/img8/0/0-64_0-64_0-4",
            "image": "/v1/image/secret/e1/img8/xy/0/0:64/0:64/0/", "etag": whole["ETag"],
            "zarr": "/zarr/secret/e1/img8/0/c/0/0/0/0", "zarr-empty": "/zarr/secret/e1/img8/0/c/0/0/0/5",
            "zarr-group": "/zarr/secret/e1/img8/zarr.json",
            "zarr-array": "/zarr/secret/e1/img8/0/zarr.json", "shard": "/precomputed-sharded/secret/e1/img8/0/0.shard",
            "sharded-info": "/precomputed-sharded/secret/e1/img8/info"}


@pytest.mark.parametrize("view", ["cutout", "precomputed", "image", "zarr", "zarr-empty", "zarr-group",
                                  "zarr-array", "shard", "sharded-info"])
def test_a_range_or_an_etag_guess_reveals_nothing_without_the_token(private: dict[str, str], view: str) -> None:
    anonymous = APIClient()
    url = private[view]
    for headers in ({"HTTP_RANGE": "bytes=0-15"}, {"HTTP_IF_NONE_MATCH": private["etag"]},
                    {"HTTP_IF_NONE_MATCH": "*"}, {"HTTP_IF_MATCH": '"guess"'}, {}):
        r = anonymous.get(url, **headers)
        # never 206, 304, 412 or the 404 of an all-zero zarr chunk: no oracle of the voxels
        assert r.status_code in (401, 403), (headers, r.status_code)
        assert "ETag" not in r and "Content-Range" not in r
        assert r["Content-Type"].startswith("application/json")  # the refusal, not a byte of the voxels
    head = anonymous.head(url)
    assert head.status_code in (401, 403) and "ETag" not in head


def test_a_preflight_gets_headers_only_and_cannot_open_writes(private: dict[str, str]) -> None:
    r = wsgi("OPTIONS", private["cutout"], extra={"HTTP_ORIGIN": "http://evil.example",
                                                   "HTTP_ACCESS_CONTROL_REQUEST_METHOD": "POST"})
    assert r.status == 204 and r.body == b""
    allowed = wsgi("OPTIONS", private["cutout"], extra={"HTTP_ACCESS_CONTROL_REQUEST_METHOD": "DELETE"})
    assert allowed.status == 204 and allowed.body == b""
    from django.test import Client

    headers = Client().options(private["cutout"], HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST")
    assert headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
    assert "Access-Control-Allow-Credentials" not in headers  # `*` and no cookies: no ambient authority


def test_absurd_ranges_are_refused_or_ignored_not_served_wrong(admin: Any, private: dict[str, str]) -> None:
    url = private["cutout"]
    body = admin.get(url, HTTP_ACCEPT="application/octet-stream").content
    for header, status in [("bytes=" + "9" * 19 + "-", 416), ("bytes=0-" + "9" * 19, 206),
                           ("bytes=" + "9" * 40 + "-", 200), ("bytes=-" + "9" * 19, 206),
                           ("bytes=0-0," * 5000, 200), ("bytes=\x00-\x01", 200)]:
        r = admin.get(url, HTTP_ACCEPT="application/octet-stream", HTTP_RANGE=header)
        assert r.status_code == status, (header[:40], r.status_code)
        if status != 416:
            assert r.content == body  # the range covers the whole body, or is ignored


def test_latest_is_gated_like_v1_and_reads_no_body_first(private: dict[str, str]) -> None:
    for path in (private["cutout"].replace("/v1/", "/latest/", 1), "/latest/collection/x/"):
        body = CountingBody(8 << 20)
        r = wsgi("POST", path, body, content_type="application/octet-stream")
        assert r.status == 401 and body.read_bytes == 0, (path, r.status)
    for path in ("/latest//admin/", "/latest/../admin/", "/latestcollection/"):
        assert wsgi("GET", path).status in (400, 404), path
    anonymous = wsgi("GET", private["cutout"].replace("/v1/", "/latest/", 1))
    assert anonymous.status in (401, 403)


def test_control_plane_gets_no_range_or_cors(admin: Any, private: dict[str, str]) -> None:
    r = admin.get("/v1/collection/", HTTP_RANGE="bytes=0-3")
    assert r.status_code == 200 and "Content-Range" not in r and "Access-Control-Allow-Origin" not in r


def test_no_refused_write_marks_a_level_built(admin: Any, private: dict[str, str], grant: Any) -> None:
    """Which levels a view advertises changes only with a write that was applied: an anonymous
    one, one without write permission, or one whose body does not decode leaves the info alone."""
    info = "/precomputed/secret/e1/img8/info"
    before = admin.get(info).content
    make_dataset(admin, name="other", levels=3)
    stranger = grant("stranger", "other", "admin")  # admin elsewhere, nothing here
    level1 = "/v1/cutout/secret/e1/img8/1/0:4/0:4/0:1/"
    answers = [wsgi("POST", level1, b"\x01" * 16, content_type="application/octet-stream").status,
               stranger.generic("POST", level1, b"\x01" * 16, content_type="application/octet-stream").status_code,
               admin.generic("POST", level1, b"\x01" * 17, content_type="application/octet-stream").status_code,
               admin.generic("POST", level1, b"BLOSC" * 4, content_type="application/blosc").status_code]
    assert answers == [401, 403, 400, 400]
    assert admin.get(info).content == before
    applied = admin.generic("POST", level1, b"\x01" * 16, content_type="application/octet-stream")
    assert applied.status_code == 201 and admin.get(info).content != before  # the control: a write that lands


def test_absurd_zarr_keys_are_404s_that_read_nothing(admin: Any, private: dict[str, str]) -> None:
    for tail in ("0/c/0/0/0/" + "9" * 40, "0/c/0/0/0/0/0", "99/zarr.json", "0/c/0/0/0/-1", "../../../v1/collection/",
                 "0/c/0/0/0/0%00", "zarr.json%0A", "0/.zarray", ".zattrs"):
        r = admin.get(f"/zarr/secret/e1/img8/{tail}")
        assert r.status_code in (400, 404) and r["Content-Type"] == "application/json", (tail, r.status_code)


def test_absurd_shard_names_and_ranges_read_nothing_wrong(admin: Any, private: dict[str, str]) -> None:
    for tail in ("0/" + "f" * 16 + ".shard", "0/00.shard", "0/ff.shard", "9/0.shard", "0/0.shard/x", "0/../info",
                 "0/-1.shard", "0/0x0.shard", "0/0.shard%00"):
        r = admin.get(f"/precomputed-sharded/secret/e1/img8/{tail}")
        assert r.status_code in (400, 404) and r["Content-Type"] == "application/json", (tail, r.status_code)
    shard = private["shard"]
    whole = admin.get(shard)
    assert whole.status_code == 200
    for header, status in [(f"bytes={len(whole.content)}-", 416), ("bytes=0-" + "9" * 19, 206),
                           ("bytes=-" + "9" * 19, 206), ("bytes=0-0," * 3000, 200), ("bytes=9-2", 200)]:
        r = admin.get(shard, HTTP_RANGE=header)
        assert r.status_code == status, (header[:40], r.status_code)
        if status != 416:
            assert r.content == whole.content
