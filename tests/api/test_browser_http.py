"""Browser-grade HTTP on the data GETs (ndstore.api.browser_http), and `/latest/` as `/v1/`:
what a viewer on another origin, a sharded reader and the Boss's clients rely on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ndstore.api.browser_http import byte_range
from ndstore.core import wire
from ndstore.core.synthetic import em_like
from tests.api.conftest import Dataset, make_dataset

BOX = ((10, 300), (20, 140), (3, 9))  # unaligned, over several cuboids


@pytest.fixture
def written(admin: Any) -> tuple[Dataset, np.ndarray]:
    data = make_dataset(admin, name="bh", levels=1)
    values = np.random.default_rng(7).integers(0, 255, (6, 120, 290), dtype=np.uint8)
    r = admin.generic("POST", data.cutout("img8", 0, *BOX), wire.format_for("application/blosc").encode(values),
                      content_type="application/blosc")
    assert r.status_code == 201, r.content
    return data, values


def _urls(data: Dataset) -> dict[str, str]:
    """One URL per data view of the same voxels."""
    (x0, x1), (y0, y1), (z0, z1) = BOX
    return {
        "cutout": data.cutout("img8", 0, *BOX),
        "direct": data.cutout("img8", 0, *BOX, direct=True),
        "image": f"/v1/image/bh/e1/img8/xy/0/{x0}:{x1}/{y0}:{y1}/{z0}/",
        "precomputed": f"/precomputed/bh/e1/img8/0/{x0}-{x1}_{y0}-{y1}_{z0}-{z1}",
    }


@pytest.mark.parametrize("view", ["cutout", "direct", "image", "precomputed"])
def test_every_data_get_has_a_strong_etag_304_range_and_head(admin: Any, written: Any, view: str) -> None:
    url = _urls(written[0])[view]
    whole = admin.get(url, HTTP_ORIGIN="http://viewer.example")
    assert whole.status_code == 200, whole.content
    etag, body = whole["ETag"], whole.content
    assert etag.startswith('"') and not etag.startswith('W/')
    assert whole["Accept-Ranges"] == "bytes" and whole["Access-Control-Allow-Origin"] == "*"
    for exposed in ("Content-Range", "Content-Length", "Content-Encoding", "ETag"):
        assert exposed in whole["Access-Control-Expose-Headers"]

    assert admin.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304
    part = admin.get(url, HTTP_RANGE="bytes=5-104")
    assert part.status_code == 206 and part.content == body[5:105]
    assert part["Content-Range"] == f"bytes 5-104/{len(body)}" and part["ETag"] == etag
    tail = admin.get(url, HTTP_RANGE="bytes=-7")
    assert tail.status_code == 206 and tail.content == body[-7:]
    rest = admin.get(url, HTTP_RANGE=f"bytes={len(body) - 3}-")
    assert rest.status_code == 206 and rest.content == body[-3:]

    head = admin.head(url)
    assert head.status_code == 200 and not head.content
    assert head["ETag"] == etag and head["Content-Length"] == str(len(body))


def test_ranges_past_the_end_several_or_malformed(admin: Any, written: Any) -> None:
    url = _urls(written[0])["cutout"]
    body = admin.get(url).content
    past = admin.get(url, HTTP_RANGE=f"bytes={len(body)}-")
    assert past.status_code == 416 and past["Content-Range"] == f"bytes */{len(body)}"
    assert "past the end" in past.json()["message"]
    overlong = admin.get(url, HTTP_RANGE=f"bytes=0-{len(body) * 10}")  # clipped to the body
    assert overlong.status_code == 206 and overlong.content == body
    for ignored in ("bytes=0-1,5-6", "items=0-5", "bytes=9-2", "bytes=-", "bytes=x-y"):
        r = admin.get(url, HTTP_RANGE=ignored)
        assert r.status_code == 200 and r.content == body, ignored


def test_if_range_with_another_etag_gets_the_whole_body(admin: Any, written: Any) -> None:
    url = _urls(written[0])["precomputed"]
    first = admin.get(url)
    assert admin.get(url, HTTP_RANGE="bytes=0-9", HTTP_IF_RANGE='"stale"').status_code == 200
    same = admin.get(url, HTTP_RANGE="bytes=0-9", HTTP_IF_RANGE=first["ETag"])
    assert same.status_code == 206 and same.content == first.content[:10]


def test_a_write_changes_the_etag_of_every_view_at_once(admin: Any, written: Any) -> None:
    data, values = written
    urls = _urls(data)
    before = {view: admin.get(url)["ETag"] for view, url in urls.items()}
    one = np.array([[[values[0, 0, 0] ^ 0xFF]]], np.uint8)
    x, y, z = BOX[0][0], BOX[1][0], BOX[2][0]
    r = admin.generic("POST", data.cutout("img8", 0, (x, x + 1), (y, y + 1), (z, z + 1)),
                      wire.format_for("application/blosc").encode(one), content_type="application/blosc")
    assert r.status_code == 201
    for view, url in urls.items():
        again = admin.get(url, HTTP_IF_NONE_MATCH=before[view])
        assert again.status_code == 200 and again["ETag"] != before[view], view


def test_preflight_of_a_read_needs_no_token_and_opens_no_writes(written: Any) -> None:
    from rest_framework.test import APIClient

    for url in _urls(written[0]).values():
        pre = APIClient().options(url, HTTP_ORIGIN="http://viewer.example",
                                  HTTP_ACCESS_CONTROL_REQUEST_METHOD="GET",
                                  HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization, range")
        assert pre.status_code == 204 and not pre.content
        assert pre["Access-Control-Allow-Origin"] == "*"
        assert "range" in pre["Access-Control-Allow-Headers"].lower()
        assert "POST" not in pre["Access-Control-Allow-Methods"]


def test_errors_of_data_routes_carry_cors(admin: Any, written: Any) -> None:
    r = admin.get("/v1/cutout/bh/e1/nope/0/0:10/0:10/0:1/", HTTP_ORIGIN="http://viewer.example")
    assert r.status_code == 404 and r["Access-Control-Allow-Origin"] == "*"


def test_latest_answers_what_v1_answers(admin: Any, written: Any) -> None:
    data, values = written
    url = data.cutout("img8", 0, *BOX)
    latest = url.replace("/v1/", "/latest/", 1)
    assert admin.get(latest).content == admin.get(url).content
    assert admin.get("/latest/collection/").json() == admin.get("/v1/collection/").json()
    assert admin.get("/latest/collection/bh").json() == admin.get("/v1/collection/bh").json()  # intern's form
    r = admin.generic("POST", latest, wire.format_for("application/blosc").encode(values[::-1].copy()),
                      content_type="application/blosc")
    assert r.status_code == 201, r.content
    got = wire.format_for("application/blosc").decode(admin.get(url, HTTP_ACCEPT="application/blosc").content,
                                                      values.shape, np.dtype(np.uint8))
    np.testing.assert_array_equal(got, values[::-1])
    missing = admin.get("/latest/no-such-route/")
    assert missing.status_code == admin.get("/v1/no-such-route/").status_code


@pytest.mark.parametrize(("header", "length", "expected"), [
    ("bytes=0-0", 10, (0, 0)), ("bytes=3-", 10, (3, 9)), ("bytes=-4", 10, (6, 9)), ("bytes=-40", 10, (0, 9)),
    ("bytes=2-400", 10, (2, 9)), ("bytes=10-", 10, "unsatisfiable"), ("bytes=-0", 10, "unsatisfiable"),
    ("bytes=0-", 0, "unsatisfiable"), ("bytes=5-1", 10, None), ("bytes=1-2,4-5", 10, None), ("bits=1-2", 10, None),
    ("bytes=" + "9" * 20 + "-", 10, None),
])
def test_byte_range_parsing(header: str, length: int, expected: Any) -> None:
    assert byte_range(header, length) == expected


def test_json_documents_are_sent_whole_whatever_the_range(admin: Any, written: Any) -> None:
    """Found by the schema fuzzer: a range of an info file was a 206 of broken JSON."""
    for url in ("/precomputed/bh/e1/img8/info", "/zarr/bh/e1/img8/zarr.json"):
        whole = admin.get(url)
        r = admin.get(url, HTTP_RANGE="bytes=-1")
        assert r.status_code == 200 and r.content == whole.content and r["Accept-Ranges"] == "none"
        assert admin.get(url, HTTP_IF_NONE_MATCH=whole["ETag"]).status_code == 304


@pytest.mark.parametrize("path", ["/v1/cutout/", "/v1/direct/cutout/", "/v1/blaze/cutout/"])
def test_a_write_through_any_path_shows_at_once_in_every_standard_view(admin: Any, written: Any, path: str) -> None:
    """Precomputed, sharded and zarr read live: a write through the cache tier, straight to the
    base tier, or into the NDBlaze buffer (still pending: no merge ran) changes what they serve."""
    data, values = written
    x, y, z = BOX[0][0], BOX[1][0], BOX[2][0]
    chunk = admin.get("/zarr/bh/e1/img8/0/zarr.json").json()["chunk_grid"]["configuration"]["chunk_shape"]
    views = {"precomputed": _urls(data)["precomputed"], "sharded": "/precomputed-sharded/bh/e1/img8/0/0.shard",
             "zarr": f"/zarr/bh/e1/img8/0/c/0/{z // chunk[1]}/{y // chunk[2]}/{x // chunk[3]}"}
    before = {view: admin.get(url) for view, url in views.items()}
    assert {view: r.status_code for view, r in before.items()} == dict.fromkeys(views, 200), before
    one = np.array([[[values[0, 0, 0] ^ 0xFF]]], np.uint8)
    url = data.cutout("img8", 0, (x, x + 1), (y, y + 1), (z, z + 1)).replace("/v1/cutout/", path)
    r = admin.generic("POST", url, wire.format_for("application/blosc").encode(one), content_type="application/blosc")
    assert r.status_code == 201, r.content
    for view, url in views.items():
        again = admin.get(url, HTTP_IF_NONE_MATCH=before[view]["ETag"])
        assert again.status_code == 200 and again["ETag"] != before[view]["ETag"], (path, view)
        assert again.content != before[view].content, (path, view)
    assert admin.get(views["precomputed"]).content[0] == one[0, 0, 0]  # the box starts at the written voxel


def test_a_large_blosc_answer_is_the_same_bytes_and_etag_every_read(admin: Any) -> None:
    # a strong ETag names one sequence of bytes, and a client may join Range reads made under it
    # (If-Range): the blosc answer must not depend on which of blosc's threads finished first
    data = make_dataset(admin, name="big", levels=1)
    box = ((0, 1024), (0, 512), (0, 16))  # 8 MiB: many blosc blocks
    values = em_like((16, 512, 1024), seed=2)  # compressible, unevenly: blocks of many sizes
    url = data.cutout("img8", 0, *box)
    blosc = wire.format_for("application/blosc")
    r = admin.generic("POST", url, blosc.encode(values), content_type="application/blosc")
    assert r.status_code == 201, r.content
    reads = [admin.get(url, HTTP_ACCEPT="application/blosc") for _ in range(4)]
    assert {r["ETag"] for r in reads} == {reads[0]["ETag"]}
    assert all(r.content == reads[0].content for r in reads)
    half = len(reads[0].content) // 2
    tail = admin.get(url, HTTP_ACCEPT="application/blosc", HTTP_RANGE=f"bytes={half}-", HTTP_IF_RANGE=reads[0]["ETag"])
    assert tail.status_code == 206
    joined = reads[0].content[:half] + tail.content
    assert np.array_equal(blosc.decode(joined, values.shape, values.dtype), values)
