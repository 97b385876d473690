"""Bad input gets a 4xx whose message names the problem, and stored data stays unchanged."""

from __future__ import annotations

import io
import pickle
import zlib
from typing import Any

import blosc
import numpy as np
import pytest
from django.test import override_settings

from ndstore.core import wire
from tests.api.conftest import Dataset

BOX = ((0, 40), (0, 30), (0, 4))
SHAPE = (4, 30, 40)


@pytest.fixture
def stored(admin: Any, dataset: Dataset) -> np.ndarray:
    data = np.random.default_rng(3).integers(1, 250, SHAPE, dtype=np.uint8)
    r = admin.generic("POST", dataset.cutout("img8", 0, *BOX), data.tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201
    return data


def assert_unchanged(admin: Any, dataset: Dataset, stored: np.ndarray) -> None:
    r = admin.get(dataset.cutout("img8", 0, *BOX), HTTP_ACCEPT="application/octet-stream")
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint8).reshape(SHAPE), stored)


def _post(admin: Any, url: str, body: bytes, media: str = "application/octet-stream") -> Any:
    return admin.generic("POST", url, body, content_type=media)


BAD_URLS = [
    ("/v1/cutout/c1/e1/img8/0/0:1200/0:30/0:4/", 400, "outside the coordinate frame"),
    ("/v1/cutout/c1/e1/img8/0/5:5/0:30/0:4/", 400, "x range 5:5 is empty"),
    ("/v1/cutout/c1/e1/img8/0/0:40/30:0/0:4/", 400, "y range 30:0"),
    ("/v1/cutout/c1/e1/img8/0/0:40/0:30/-2:4/", 400, "z range -2:4"),
    ("/v1/cutout/c1/e1/img8/7/0:40/0:30/0:4/", 400, "resolution 7 does not exist"),
    ("/v1/cutout/c1/e1/img8/0/0:40/0:30/0:4/0:2/", 400, "time range 0:2"),
    ("/v1/cutout/c1/e1/img8/0/a:b/0:30/0:4/", 400, "malformed cutout URL"),
    ("/v1/cutout/c1/e1/nope/0/0:40/0:30/0:4/", 404, "channel c1/e1/nope does not exist"),
    ("/v1/cutout/zz/e1/img8/0/0:40/0:30/0:4/", 404, "collection 'zz' does not exist"),
]


@pytest.mark.parametrize("url,status,message", BAD_URLS)
def test_bad_urls(admin: Any, dataset: Dataset, stored: np.ndarray, url: str, status: int, message: str) -> None:
    for r in (admin.get(url), _post(admin, url, stored.tobytes())):
        assert r.status_code == status, r.content
        assert message in r.json()["message"]
    assert_unchanged(admin, dataset, stored)


def _pickled_exploit() -> bytes:
    # padded (the unpickler stops at the pickle's end) to the size of the box's array
    return blosc.compress(pickle.dumps(print) + bytes(4800), typesize=1)


def _pickle_memo_bomb() -> bytes:
    # a pickle that puts into memo slot 2**31: a plain unpickler grows its memo to 16 GiB first
    pickled = b"\x80\x04Nr" + (2**31).to_bytes(4, "little") + b"."
    return blosc.compress(pickled + bytes(4800 - len(pickled)), typesize=1)


def _corrupt_blosc() -> bytes:
    body = bytearray(blosc.compress((np.arange(4800) % 7).astype(np.uint8).tobytes(), typesize=1))
    body[len(body) // 2:len(body) // 2 + 6] = b"\xff" * 6  # framing intact, content not
    return bytes(body)


def _npy_header(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": shape})
    return buf.getvalue()


BAD_BODIES = [
    ("application/octet-stream", b"\x00" * 10, "body holds 10 bytes"),
    ("application/octet-stream", b"", "request body is empty"),
    ("application/blosc", b"definitely not blosc" * 3, "blosc"),
    ("application/blosc", blosc.compress(np.zeros(SHAPE, np.uint16).tobytes(), typesize=2), "needs 4800"),
    ("application/blosc", blosc.compress(bytes(4800), typesize=1)[:-10], "the body holds"),
    ("application/blosc", _corrupt_blosc(), "corrupt"),
    ("application/blosc-python", _pickled_exploit(), "not a part of a numpy array"),
    ("application/blosc-python", _pickle_memo_bomb(), "bytes after its pickle"),
    ("application/blosc-python", blosc.pack_array(np.zeros((4, 30, 20), np.uint16)), "dtype uint16"),
    ("application/npygz", zlib.compress(b"garbage"), "not a .npy array"),
    ("application/npygz", wire.FORMATS["application/npygz"].encode(np.zeros((4, 60, 80), np.uint8)), "inflates past"),
    ("application/npygz", wire.FORMATS["application/npygz"].encode(np.zeros((4, 40, 30), np.uint8)), "shape"),
    ("application/npygz", b"\x78\x9c not zlib", "not zlib"),
    # a .npy header claiming 4 GB: refused by its shape, before numpy allocates for it
    ("application/npygz", zlib.compress(_npy_header((4000, 1000, 1000)) + bytes(64)),
     "body has shape (4000, 1000, 1000)"),
    ("application/npygz", wire.FORMATS["application/npygz"].encode(np.zeros(SHAPE, np.uint8))[:-3], "truncated"),
    ("application/npygz", wire.FORMATS["application/npygz"].encode(np.zeros(SHAPE, np.uint8)) + b"junk",
     "4 bytes after its zlib/gzip stream"),
]


@pytest.mark.parametrize("media,body,message", BAD_BODIES)
def test_bad_bodies(admin: Any, dataset: Dataset, stored: np.ndarray, media: str, body: bytes, message: str) -> None:
    r = _post(admin, dataset.cutout("img8", 0, *BOX), body, media)
    assert r.status_code == 400, r.content
    assert message in r.json()["message"]
    assert_unchanged(admin, dataset, stored)


def test_decompression_bomb_is_refused_before_inflating(admin: Any, dataset: Dataset, stored: np.ndarray) -> None:
    bomb = blosc.compress(bytes(8 << 20), typesize=1)  # 8 MiB of zeros in a few KiB
    assert len(bomb) < 64 << 10  # within what a body of this box may take: its size is checked first
    r = _post(admin, dataset.cutout("img8", 0, *BOX), bomb, "application/blosc")
    assert r.status_code == 400 and "needs 4800" in r.json()["message"]
    gz = zlib.compress(bytes(16 << 20))
    r = _post(admin, dataset.cutout("img8", 0, *BOX), gz, "application/npygz")
    assert r.status_code == 400 and "inflates past" in r.json()["message"]
    big_bomb = blosc.compress(bytes(512 << 20), typesize=1)  # 2 MiB: more than any body of the box
    r = _post(admin, dataset.cutout("img8", 0, *BOX), big_bomb, "application/blosc")
    assert r.status_code == 413 and "exceeds" in r.json()["message"]
    assert_unchanged(admin, dataset, stored)


def test_unknown_media_types(admin: Any, dataset: Dataset, stored: np.ndarray) -> None:
    url = dataset.cutout("img8", 0, *BOX)
    r = _post(admin, url, stored.tobytes(), "image/tiff")
    assert r.status_code == 415 and "image/tiff" in r.json()["message"]
    r = admin.get(url, HTTP_ACCEPT="image/tiff")
    assert r.status_code == 406 and r["Content-Type"] == "application/json"
    assert_unchanged(admin, dataset, stored)


def test_body_size_cap_gives_413(admin: Any, dataset: Dataset, stored: np.ndarray, service_env: Any) -> None:
    from ndstore import wiring

    cap = wiring.services().config.max_body_bytes
    url = dataset.cutout("img8", 0, (0, 1024), (0, 512), (0, 100))
    r = _post(admin, url, bytes(cap + 1))
    assert r.status_code == 413 and "exceeds" in r.json()["message"]
    assert_unchanged(admin, dataset, stored)


def test_box_size_cap_gives_413(admin: Any, dataset: Dataset) -> None:
    r = admin.get(dataset.cutout("img8", 0, (0, 1100), (0, 700), (0, 100)).replace("/img8/", "/ann64/"))
    assert r.status_code == 413 and "limit per request" in r.json()["message"]


@pytest.mark.parametrize("query,message", [("filter=1,x", "comma-separated"), ("filter=-1", "negative"),
                                           ("filter=3,18446744073709551616", "past the largest uint64 label"),
                                           ("access-mode=fast", "access-mode must be one of")])
def test_bad_query_parameters(admin: Any, dataset: Dataset, query: str, message: str) -> None:
    r = admin.get(dataset.cutout("ann64", 0, *BOX) + "?" + query)
    assert r.status_code == 400 and message in r.json()["message"]


def test_filter_on_image_channel_is_refused(admin: Any, dataset: Dataset) -> None:
    r = admin.get(dataset.cutout("img8", 0, *BOX) + "?filter=1")
    assert r.status_code == 400 and "annotation channels only" in r.json()["message"]


@override_settings()
def test_errors_are_json_even_when_blosc_was_accepted(admin: Any, dataset: Dataset) -> None:
    r = admin.get("/v1/cutout/c1/e1/img8/0/0:5000/0:30/0:4/", HTTP_ACCEPT="application/blosc")
    assert r.status_code == 400 and r["Content-Type"] == "application/json"
    assert r.json()["status"] == 400


def test_a_damaged_stored_supercuboid_is_a_500_that_names_the_damage(admin: Any, dataset: Dataset,
                                                                   stored: np.ndarray) -> None:
    """Damage in the base tier (a bad disk under the file store, a bug) is the service's fault,
    not the request's: 500 with a message that says what is damaged, not a 400 and no voxels."""
    from ndstore.wiring import services

    objects = services().objects
    direct = dataset.cutout("img8", 0, *BOX).replace("/v1/cutout/", "/v1/direct/cutout/")
    assert admin.get(direct, HTTP_ACCEPT="application/octet-stream").status_code == 200  # written back
    keys = [k for k in objects.list_keys() if _is_supercuboid(k)]
    assert keys
    for key in keys:
        good = next(blob for _, blob in objects.get_many([key]))
        assert good is not None
        objects.put_many({key: good[:-7]})  # cut short, as by a torn write
    r = admin.get(direct + "?access-mode=raw", HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 500, r.content[:200]
    assert "supercuboid object is truncated" in r.json()["message"], r.json()


def _is_supercuboid(object_key: str) -> bool:
    from ndstore.core.keys import SupercuboidKey

    try:
        SupercuboidKey.parse(object_key)
    except ValueError:
        return False
    return True
