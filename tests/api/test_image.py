"""Slice images: every orientation returns exactly the stored plane, windows and colour maps
behave, caching headers work, bad requests are 4xx that say what is wrong."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset

FRAME = (300, 200, 40)


def _write(client: APIClient, channel: str, data: np.ndarray) -> None:
    z, y, x = data.shape
    r = client.generic("POST", f"/v1/cutout/c1/e1/{channel}/0/0:{x}/0:{y}/0:{z}/", data.tobytes(),
                       content_type="application/octet-stream")
    assert r.status_code == 201, r.content


def _image(response: object) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(response.content)))  # type: ignore[attr-defined]


def test_each_orientation_returns_the_stored_plane(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME, channels={"img8": "uint8"})
    data = np.random.default_rng(1).integers(0, 256, (40, 200, 300), np.uint8)
    _write(admin, "img8", data)
    xy = admin.get("/v1/image/c1/e1/img8/xy/0/10:266/20:150/7/")
    assert xy.status_code == 200 and xy["Content-Type"] == "image/png"
    assert np.array_equal(_image(xy), data[7, 20:150, 10:266])
    xz = admin.get("/v1/image/c1/e1/img8/xz/0/0:300/33/5:40/")
    assert np.array_equal(_image(xz), data[5:40, 33, :])
    yz = admin.get("/v1/image/c1/e1/img8/yz/0/299/0:200/0:40/")
    assert np.array_equal(_image(yz), data[:, :, 299])


def test_uint16_is_exact_as_png_and_windowed_on_request(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME, channels={"img16": "uint16"})
    data = np.random.default_rng(2).integers(0, 65536, (1, 200, 300), np.uint16)
    _write(admin, "img16", data)
    exact = admin.get("/v1/image/c1/e1/img16/xy/0/0:300/0:200/0/")
    assert np.array_equal(_image(exact).astype(np.uint16), data[0])
    windowed = admin.get("/v1/image/c1/e1/img16/xy/0/0:300/0:200/0/?window=1000,2000")
    got = _image(windowed)
    assert got.dtype == np.uint8
    expect = np.clip(np.rint((data[0].astype(np.float64) - 1000) * 255 / 1000), 0, 255)
    assert np.abs(got.astype(int) - expect).max() <= 1
    jpeg = admin.get("/v1/image/c1/e1/img16/xy/0/0:300/0:200/0/?format=jpeg")
    assert jpeg.status_code == 200 and jpeg["Content-Type"] == "image/jpeg"
    assert _image(jpeg).shape == (200, 300)


def test_float32_goes_through_a_window(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME, channels={"f32": "float32"})
    data = np.linspace(-1, 2, 300 * 200, dtype=np.float32).reshape(1, 200, 300)
    _write(admin, "f32", data)
    got = _image(admin.get("/v1/image/c1/e1/f32/xy/0/0:300/0:200/0/"))  # default window 0..1
    expect = np.clip(np.rint(data[0].astype(np.float64) * 255), 0, 255)
    assert np.abs(got.astype(int) - expect).max() <= 1


def test_annotation_labels_get_stable_colours_and_zero_is_transparent(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME, channels={"ann64": "uint64"})
    labels = np.zeros((1, 200, 300), np.uint64)
    labels[0, :100, :150] = 7
    labels[0, 100:, 150:] = 2**40 + 3
    _write(admin, "ann64", labels)
    a = _image(admin.get("/v1/image/c1/e1/ann64/xy/0/0:150/0:100/0/"))
    b = _image(admin.get("/v1/image/c1/e1/ann64/xy/0/0:300/0:200/0/"))
    assert a.shape == (100, 150, 4)
    assert np.array_equal(b[:100, :150], a)  # the same id, the same colour, in any tile
    assert (b[150, 250, :3] != b[50, 50, :3]).any()
    assert b[150, 50, 3] == 0 and b[50, 50, 3] == 255


def test_an_unchanged_tile_is_a_304_with_its_etag(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME)
    _write(admin, "img8", np.full((1, 10, 10), 9, np.uint8))
    url = "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/"
    first = admin.get(url)
    assert first["ETag"] and "max-age" in first["Cache-Control"]
    again = admin.get(url, HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and not again.content
    _write(admin, "img8", np.full((1, 10, 10), 10, np.uint8))
    changed = admin.get(url, HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed["ETag"] != first["ETag"]


def test_bad_image_requests_say_what_is_wrong(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME)
    cases = {
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/?window=5,1": "window",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/?window=abc": "window",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/?format=jpeg&quality=0": "quality",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/?format=jpeg&quality=%C2%B9": "quality",  # isdigit(), not int()
        "/v1/image/c1/e1/img8/xy/0/0:400/0:64/0/": "outside",
        "/v1/image/c1/e1/img8/xy/9/0:64/0:64/0/": "resolution",
        "/v1/image/c1/e1/img8/zz/0/0:64/0:64/0/": "malformed image URL",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/": "malformed image URL",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/5/": "time",
        "/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/?format=gif": "unknown format 'gif': this endpoint answers jpeg, png",
    }
    for url, needle in cases.items():
        r = admin.get(url)
        assert 400 <= r.status_code < 500, (url, r.status_code)
        assert needle in r.json()["message"], (url, r.json())
    assert admin.get("/v1/image/nope/e1/img8/xy/0/0:64/0:64/0/").status_code == 404


def test_a_private_channel_needs_a_token(admin: APIClient) -> None:
    make_dataset(admin, frame=FRAME)
    anonymous = APIClient().get("/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/")
    assert anonymous.status_code in (401, 403)
    assert admin.put("/v1/collection/c1/", {"public": True}, format="json").status_code == 200
    public = APIClient().get("/v1/image/c1/e1/img8/xy/0/0:64/0:64/0/")
    assert public.status_code == 200 and public["Cache-Control"].startswith("public")
