"""What Neuroglancer's `boss://` source asks of a public channel, under `/latest/` as it sends
it: the coordinate frame (anonymously) and the downsample status (without a trailing slash)
before its first chunk, then cutouts of uint8 channels as JPEG images."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset


@pytest.fixture
def public(admin: APIClient) -> None:
    make_dataset(admin, name="bpub")
    make_dataset(admin, name="bpriv")
    assert admin.put("/v1/collection/bpub/", {"public": True}, format="json").status_code == 200


def test_a_public_channels_frame_is_read_anonymously_others_need_a_token(admin: APIClient, public: None) -> None:
    anonymous = APIClient()
    r = anonymous.get("/latest/coord/bpub_frame/")
    assert r.status_code == 200 and r.json()["x_stop"] == 1100, r.content
    assert anonymous.get("/latest/coord/bpub_frame").status_code == 200  # the Boss's slashless form
    refused = anonymous.get("/latest/coord/bpriv_frame/")
    assert refused.status_code == 401 and "no public collection uses" in refused.json()["message"]
    assert admin.get("/latest/coord/bpriv_frame/").status_code == 200
    assert anonymous.delete("/latest/coord/bpub_frame/").status_code == 401  # reading is all it opens


def test_the_downsample_status_answers_without_its_trailing_slash(admin: APIClient, public: None) -> None:
    anonymous = APIClient()
    with_slash = anonymous.get("/latest/downsample/bpub/e1/img8/")
    without = anonymous.get("/latest/downsample/bpub/e1/img8")
    assert with_slash.status_code == without.status_code == 200, without.content
    assert with_slash.json() == without.json()
    assert anonymous.get("/latest/downsample/bpriv/e1/img8").status_code == 401


def test_uint8_cutouts_come_as_jpeg_and_png_images_of_stacked_planes(admin: APIClient) -> None:
    """Neuroglancer's boss:// source asks uint8 image channels for image/jpeg and decodes the
    image as the box's voxels in C order: (z, y) rows stacked, x across."""
    from tests.api.conftest import make_dataset as dataset

    ds = dataset(admin, name="bimg", levels=1, channels={"img8": "uint8", "img16": "uint16", "ann64": "uint64"})
    rng = np.random.default_rng(4)
    smooth = np.repeat(np.repeat(rng.integers(0, 255, (4, 8, 8)), 8, axis=1), 8, axis=2).astype(np.uint8)
    box = ((0, 64), (0, 64), (0, 4))
    assert admin.generic("POST", ds.cutout("img8", 0, *box), smooth.tobytes(),
                         content_type="application/octet-stream").status_code == 201
    jpeg = admin.get(ds.cutout("img8", 0, *box), HTTP_ACCEPT="image/jpeg")
    assert jpeg.status_code == 200 and jpeg["Content-Type"] == "image/jpeg", jpeg.content[:200]
    pixels = np.asarray(Image.open(io.BytesIO(jpeg.content)))
    assert pixels.shape == (4 * 64, 64)
    assert np.abs(pixels.astype(int) - smooth.reshape(-1, 64).astype(int)).mean() < 4  # lossy, close
    png = admin.get(ds.cutout("img8", 0, *box), HTTP_ACCEPT="image/png")
    assert png.status_code == 200 and png["Content-Type"] == "image/png"
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png.content))), smooth.reshape(-1, 64))
    wide = rng.integers(0, 65535, (4, 64, 64)).astype(np.uint16)
    assert admin.generic("POST", ds.cutout("img16", 0, *box), wide.tobytes(),
                         content_type="application/octet-stream").status_code == 201
    png16 = admin.get(ds.cutout("img16", 0, *box) + "?format=png")
    assert png16.status_code == 200
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png16.content))), wide.reshape(-1, 64))
    for channel, media in (("img16", "image/jpeg"), ("ann64", "image/jpeg"), ("ann64", "image/png")):
        refused = admin.get(ds.cutout(channel, 0, *box), HTTP_ACCEPT=media)
        assert refused.status_code == 406 and "this channel stores" in refused.json()["message"], (channel, media)
    assert admin.get(ds.cutout("img8", 0, *box), HTTP_ACCEPT="*/*")["Content-Type"] == "application/blosc"
