"""Neuroglancer precomputed endpoints: the info JSON, chunk files, errors and CORS through
Django's request stack; then the real CloudVolume (and TensorStore, where installed) reading a
live server on 127.0.0.1 gets exactly the voxels written through /v1/cutout, at levels 0 and 1,
for boxes that cross chunk boundaries and boxes at the volume's upper edge."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core import precomputed
from ndstore.core.geometry import Box, level_extent
from tests.api.conftest import Dataset, make_dataset

LABELS = np.array([0, 1, 7, 2**40 + 3, 2**63 + 12345, 2**64 - 1], dtype=np.uint64)


def make_frame_dataset(client: APIClient, name: str, lo: tuple[int, int, int], hi: tuple[int, int, int],
                       voxel: tuple[float, float, float], unit: str, method: str, levels: int,
                       channels: dict[str, str]) -> Dataset:
    """A dataset whose frame starts away from 0, with a voxel size and unit of its own."""
    fields = {f"{a}_start": v for a, v in zip("xyz", lo)}
    fields.update({f"{a}_voxel_size": v for a, v in zip("xyz", voxel)}, voxel_unit=unit)
    return make_dataset(client, name, hi, levels, method, channels=channels, frame_fields=fields)


def write(client: APIClient, ds: Dataset, channel: str, res: int, box: Box, data: np.ndarray) -> None:
    """Write `data` (z, y, x) through the cache tier as a raw C-order body."""
    url = ds.cutout(channel, res, *zip(box.lo, box.hi))
    r = client.generic("POST", url, data.tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201, r.content


def random_volume(shape_zyx: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "uint64":
        return LABELS[rng.integers(0, len(LABELS), shape_zyx)]
    return rng.integers(0, np.iinfo(dtype).max, shape_zyx, dtype=dtype, endpoint=True)


def fill_levels(client: APIClient, ds: Dataset, channel: str, frame: Box, method: str,
                levels: int) -> list[np.ndarray]:
    """Random voxels over every level's whole extent (level 1 written directly, not downsampled);
    returns each level as a (z, y, x) array whose [0, 0, 0] is the extent's first voxel."""
    out = []
    for res in range(levels):
        extent = level_extent(frame, res, method)  # type: ignore[arg-type]
        data = random_volume(extent.shape_zyx, ds.channels[channel], seed=res)
        write(client, ds, channel, res, extent, data)
        out.append(data)
    return out


def write_one_voxel_per_level(client: APIClient, ds: Dataset, channel: str, frame: Box, method: str,
                              levels: int) -> None:
    """Levels above the base are advertised once they hold data (ndstore.api.levels)."""
    for res in range(1, levels):
        lo = level_extent(frame, res, method).lo  # type: ignore[arg-type]
        write(client, ds, channel, res, Box(lo, tuple(v + 1 for v in lo)), np.ones((1, 1, 1), ds.channels[channel]))


# -- the info file, chunk files, errors and CORS, in-process ---------------------------------------


@pytest.fixture
def ng(admin: APIClient) -> Dataset:
    return make_frame_dataset(admin, "ng", lo=(10, 5, 3), hi=(300, 200, 50), voxel=(4.0, 4.0, 40.0),
                              unit="nanometers", method="anisotropic", levels=3,
                              channels={"img8": "uint8", "img16": "uint16", "f32": "float32", "ann64": "uint64"})


def info_of(client: APIClient, path: str) -> dict[str, Any]:
    r = client.get(path)
    assert r.status_code == 200, r.content
    assert r["Content-Type"] == "application/json"
    return json.loads(r.content)


def test_info_of_an_anisotropic_image_channel(admin: APIClient, ng: Dataset) -> None:
    assert [s["key"] for s in info_of(admin, "/precomputed/ng/e1/img16/info")["scales"]] == ["0"]  # nothing built
    write_one_voxel_per_level(admin, ng, "img16", Box((10, 5, 3), (300, 200, 50)), "anisotropic", 3)
    info = info_of(admin, "/precomputed/ng/e1/img16/info")
    assert info["@type"] == "neuroglancer_multiscale_volume"
    assert (info["type"], info["data_type"], info["num_channels"]) == ("image", "uint16", 1)
    assert [s["key"] for s in info["scales"]] == ["0", "1", "2"]
    s0, s1, s2 = info["scales"]
    assert (s0["voxel_offset"], s0["size"], s0["resolution"]) == ([10, 5, 3], [290, 195, 47], [4.0, 4.0, 40.0])
    # x and y halve per level (rounding outward, as the engine's level extent does); z stays
    assert (s1["voxel_offset"], s1["size"], s1["resolution"]) == ([5, 2, 3], [145, 98, 47], [8.0, 8.0, 40.0])
    assert (s2["voxel_offset"], s2["size"], s2["resolution"]) == ([2, 1, 3], [73, 49, 47], [16.0, 16.0, 40.0])
    for s in info["scales"]:
        assert s["chunk_sizes"] == [[128, 128, 8]]  # the engine's cuboid for 2-byte voxels
        assert s["encoding"] == "raw"
    assert info_of(admin, "/precomputed/ng/e1/f32/info")["scales"][0]["chunk_sizes"] == [[128, 128, 4]]


def test_info_of_an_isotropic_frame_in_micrometers(admin: APIClient) -> None:
    ds = make_frame_dataset(admin, "iso", lo=(0, 0, 0), hi=(101, 64, 33), voxel=(0.5, 0.5, 0.25),
                            unit="micrometers", method="isotropic", levels=2, channels={"img8": "uint8"})
    write_one_voxel_per_level(admin, ds, "img8", Box((0, 0, 0), (101, 64, 33)), "isotropic", 2)
    s0, s1 = info_of(admin, "/precomputed/iso/e1/img8/info")["scales"]
    assert (s0["size"], s0["resolution"], s0["chunk_sizes"]) == ([101, 64, 33], [500.0, 500.0, 250.0], [[64] * 3])
    assert (s1["size"], s1["resolution"]) == ([51, 32, 17], [1000.0, 1000.0, 500.0])


def test_annotation_channels_are_segmentations(admin: APIClient, ng: Dataset) -> None:
    info = info_of(admin, "/precomputed/ng/e1/ann64/info")
    assert (info["type"], info["data_type"]) == ("segmentation", "uint64")
    assert info["scales"][0]["encoding"] == "compressed_segmentation"
    assert info["scales"][0]["compressed_segmentation_block_size"] == [8, 8, 8]
    raw = info_of(admin, "/precomputed/ng/e1/ann64/raw/info")
    assert raw["scales"][0]["encoding"] == "raw" and "compressed_segmentation_block_size" not in raw["scales"][0]
    r = admin.get("/precomputed/ng/e1/img8/compressed_segmentation/info")
    assert r.status_code == 400 and b"annotation channels only" in r.content


def test_raw_chunk_is_little_endian_x_fastest(admin: APIClient, ng: Dataset) -> None:
    box = Box((10, 5, 3), (138, 133, 11))
    data = random_volume(box.shape_zyx, "uint16", seed=3)
    write(admin, ng, "img16", 0, box, data)
    r = admin.get(f"/precomputed/ng/e1/img16/0/{precomputed.chunk_name(box)}")
    assert r.status_code == 200 and r["Content-Type"] == "application/octet-stream"
    got = np.frombuffer(r.content, "<u2").reshape(box.shape_zyx[::-1], order="F")  # (x, y, z) as the spec says
    np.testing.assert_array_equal(got, data.transpose(2, 1, 0))


def test_compressed_segmentation_chunk_decodes_to_the_labels(admin: APIClient, ng: Dataset) -> None:
    import compressed_segmentation

    box = Box((100, 60, 7), (228, 188, 9))
    data = random_volume(box.shape_zyx, "uint64", seed=4)
    write(admin, ng, "ann64", 0, box, data)
    r = admin.get(f"/precomputed/ng/e1/ann64/0/{precomputed.chunk_name(box)}")
    assert r.status_code == 200, r.content
    got = compressed_segmentation.decompress(r.content, box.shape_zyx[::-1], np.uint64, (8, 8, 8), order="F")
    np.testing.assert_array_equal(got, data.transpose(2, 1, 0))
    raw = admin.get(f"/precomputed/ng/e1/ann64/raw/0/{precomputed.chunk_name(box)}")
    np.testing.assert_array_equal(np.frombuffer(raw.content, "<u8").reshape(box.shape_zyx), data)


def test_etag_answers_a_repeat_with_304(admin: APIClient, ng: Dataset) -> None:
    url = "/precomputed/ng/e1/img8/1/5-133_2-98_3-19"
    first = admin.get(url)
    assert first.status_code == 200 and first["ETag"] and first["Cache-Control"].startswith("private")
    again = admin.get(url, HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and again["ETag"] == first["ETag"] and not again.content
    write(admin, ng, "img8", 1, Box((5, 2, 3), (6, 3, 4)), np.full((1, 1, 1), 9, np.uint8))
    assert admin.get(url, HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 200


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/precomputed/ng/e1/img8/3/10-138_5-133_3-19", 404, "scale key '3' does not exist"),
    ("/precomputed/ng/e1/img8/01/10-138_5-133_3-19", 404, "scale key '01' does not exist"),
    ("/precomputed/ng/e1/img8/x/10-138_5-133_3-19", 404, "scale key 'x' does not exist"),
    # digits to str.isdigit() that are not ASCII: one int() refuses (a 500 before), one it reads as 3
    ("/precomputed/ng/e1/img8/\u00b9/10-138_5-133_3-19", 404, "scale key '\u00b9' does not exist"),
    ("/precomputed/ng/e1/img8/\u0663/10-138_5-133_3-19", 404, "scale key '\u0663' does not exist"),
    ("/precomputed/ng/e1/img8/0/138-10_5-133_3-19", 400, "x range 138:10 is empty"),
    ("/precomputed/ng/e1/img8/0/10-10_5-133_3-19", 400, "x range 10:10 is empty"),
    ("/precomputed/ng/e1/img8/0/0-128_5-133_3-19", 400, "outside the coordinate frame"),
    ("/precomputed/ng/e1/img8/0/256-301_5-133_3-19", 400, "outside the coordinate frame"),
    ("/precomputed/ng/e1/img8/1/5-133_2-101_3-19", 400, "outside the coordinate frame"),
    ("/precomputed/ng/e1/img8/0/10-138_5-133", 404, "no such precomputed file"),
    ("/precomputed/ng/e1/img8/0/a-b_5-133_3-19", 404, "no such precomputed file"),
    ("/precomputed/ng/e1/img8/provenance", 404, "no such precomputed file"),
    ("/precomputed/ng/e1/img8/jpeg/info", 404, "no such precomputed file"),
    ("/precomputed/ng/e1/nope/info", 404, "channel ng/e1/nope does not exist"),
    ("/precomputed/ng/e9/img8/0/10-138_5-133_3-19", 404, "experiment ng/e9 does not exist"),
])
def test_errors_name_the_problem_and_carry_cors(admin: APIClient, ng: Dataset, path: str, status: int,
                                                says: str) -> None:
    r = admin.get(path)
    assert r.status_code == status, r.content
    assert says in r.json()["message"]
    assert r["Access-Control-Allow-Origin"] == "*"


def test_private_channels_need_a_token_public_ones_do_not(admin: APIClient, ng: Dataset) -> None:
    anonymous = APIClient()
    for path in ("/precomputed/ng/e1/img8/info", "/precomputed/ng/e1/img8/0/10-138_5-133_3-19"):
        r = anonymous.get(path)
        assert r.status_code == 401 and r["Access-Control-Allow-Origin"] == "*"
    assert admin.put("/v1/collection/ng/", {"public": True}, format="json").status_code == 200
    for path in ("/precomputed/ng/e1/img8/info", "/precomputed/ng/e1/img8/0/10-138_5-133_3-19"):
        r = anonymous.get(path)
        assert r.status_code == 200 and r["Cache-Control"].startswith("public")


def test_cors_on_get_head_and_preflight(admin: APIClient, ng: Dataset) -> None:
    url = "/precomputed/ng/e1/img8/0/10-138_5-133_3-19"
    r = admin.get(url, HTTP_ORIGIN="http://viewer.example", HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 200 and r["Access-Control-Allow-Origin"] == "*"
    assert "ETag" in r["Access-Control-Expose-Headers"]
    head = admin.head(url)
    assert head.status_code == 200 and head["Access-Control-Allow-Origin"] == "*" and not head.content
    for path in (url, "/precomputed/ng/e1/img8/info", "/precomputed/anything"):
        pre = APIClient().options(path, HTTP_ORIGIN="http://viewer.example",
                                  HTTP_ACCESS_CONTROL_REQUEST_METHOD="GET",
                                  HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization")
        assert pre.status_code == 204, pre.content
        assert pre["Access-Control-Allow-Origin"] == "*"
        assert "GET" in pre["Access-Control-Allow-Methods"]
        assert "authorization" in pre["Access-Control-Allow-Headers"].lower()


# -- real clients against a live server ------------------------------------------------------------


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any name lookup or connection that would leave 127.0.0.0/8 (clients must not reach out)."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def local(host: Any) -> bool:
        if host in ("localhost", None):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            assert local(address[0]), f"connection to {address} leaves the machine"
        return real_connect(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        assert local(host if isinstance(host, str | None) else host.decode()), f"name lookup of {host!r}"
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield


@pytest.fixture
def served(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The live server's URL. Its threads must finish before the test ends (a server thread that
    outlives the test touches the test database after it is gone): every answer says
    `Connection: close` here, so a reader that pools connections (zarr-python's aiohttp,
    TensorStore's curl) opens one per request and no thread waits on an idle one; CloudVolume's
    shared pool is closed as well."""
    from django.core.servers.basehttp import ServerHandler

    keep_alive_headers = ServerHandler.cleanup_headers

    def closing_headers(handler: Any) -> None:
        keep_alive_headers(handler)
        handler.headers["Connection"] = "close"
        handler.request_handler.close_connection = True

    monkeypatch.setattr(ServerHandler, "cleanup_headers", closing_headers)
    yield live_server.url
    from cloudfiles.interfaces import HttpInterface

    HttpInterface.adaptor.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        "process_request_thread" in t.name for t in threading.enumerate()
    ):
        time.sleep(0.02)


def cloudvolume(url: str, mip: int) -> Any:
    from cloudvolume import CloudVolume

    return CloudVolume(f"precomputed://{url}", mip=mip, cache=False, progress=False, fill_missing=False,
                       bounded=True, parallel=1)


def check_reads(url: str, levels: list[np.ndarray], extents: list[Box]) -> None:
    """Read every level whole, a box across chunk boundaries and a box at the upper edge."""
    for res, (ref, extent) in enumerate(zip(levels, extents)):
        vol = cloudvolume(url, res)
        assert list(vol.bounds.minpt) == list(extent.lo) and list(vol.bounds.maxpt) == list(extent.hi)
        (x0, y0, z0), (x1, y1, z1) = extent.lo, extent.hi
        boxes = [
            Box(extent.lo, extent.hi),
            Box((x0 + 37, y0 + 21, z0 + 5), (min(x1, x0 + 171), min(y1, y0 + 150), min(z1, z0 + 27))),
            Box((x1 - 20, y1 - 9, z1 - 3), (x1, y1, z1)),
        ]
        for box in boxes:
            got = vol[box.lo[0]:box.hi[0], box.lo[1]:box.hi[1], box.lo[2]:box.hi[2]]
            assert got.dtype == ref.dtype and got.shape == (*box.shape_zyx[::-1], 1)
            want = ref[box.slices_zyx(extent.lo)]
            np.testing.assert_array_equal(np.asarray(got)[..., 0], want.transpose(2, 1, 0), err_msg=f"{res} {box}")


@pytest.mark.parametrize(("dtype", "method"), [("uint8", "anisotropic"), ("uint16", "isotropic")])
def test_cloudvolume_reads_image_channels(served: str, admin: APIClient, loopback_only: None, dtype: str,
                                          method: str) -> None:
    lo, hi = (10, 5, 3), (300, 200, 50)
    ds = make_frame_dataset(admin, "cv", lo=lo, hi=hi, voxel=(4.0, 4.0, 40.0), unit="nanometers", method=method,
                            levels=2, channels={"img": dtype})
    assert admin.put("/v1/collection/cv/", {"public": True}, format="json").status_code == 200
    frame = Box(lo, hi)
    levels = fill_levels(admin, ds, "img", frame, method, 2)
    url = f"{served}/precomputed/cv/e1/img"
    assert cloudvolume(url, 0).layer_type == "image"
    check_reads(url, levels, [level_extent(frame, r, method) for r in range(2)])  # type: ignore[arg-type]


def test_cloudvolume_reads_a_private_channel_with_its_token_in_secrets(served: str, admin: APIClient,
                                                                        loopback_only: None) -> None:
    """CloudVolume (cloudfiles) sends only HTTP Basic auth: the token is the password."""
    from cloudvolume import CloudVolume

    lo, hi = (0, 0, 0), (200, 150, 20)
    ds = make_frame_dataset(admin, "cvp", lo=lo, hi=hi, voxel=(4.0, 4.0, 40.0), unit="nanometers",
                            method="anisotropic", levels=1, channels={"img": "uint8"})
    (level,) = fill_levels(admin, ds, "img", Box(lo, hi), "anisotropic", 1)
    token = admin._credentials["HTTP_AUTHORIZATION"].split()[1]
    url = f"precomputed://{served}/precomputed/cvp/e1/img"
    options = {"mip": 0, "cache": False, "progress": False, "parallel": 1}
    vol = CloudVolume(url, secrets={"user": "anyone", "password": token}, **options)
    np.testing.assert_array_equal(np.asarray(vol[:, :, :])[..., 0], level.transpose(2, 1, 0))
    with pytest.raises(Exception, match="401|[Uu]nauthori|[Ff]orbidden|403"):
        CloudVolume(url, secrets={"user": "anyone", "password": "not-a-token"}, **options)


@pytest.mark.parametrize("encoding", ["", "raw/"])
def test_cloudvolume_reads_uint64_segmentation(served: str, admin: APIClient, loopback_only: None,
                                               encoding: str) -> None:
    lo, hi = (0, 0, 0), (200, 150, 20)
    ds = make_frame_dataset(admin, "seg", lo=lo, hi=hi, voxel=(8.0, 8.0, 30.0), unit="nanometers",
                            method="anisotropic", levels=2, channels={"ann64": "uint64"})
    assert admin.put("/v1/collection/seg/", {"public": True}, format="json").status_code == 200
    frame = Box(lo, hi)
    levels = fill_levels(admin, ds, "ann64", frame, "anisotropic", 2)
    url = f"{served}/precomputed/seg/e1/ann64/{encoding}".rstrip("/")
    vol = cloudvolume(url, 0)
    assert vol.layer_type == "segmentation" and vol.encoding == (encoding.rstrip("/") or "compressed_segmentation")
    check_reads(url, levels, [level_extent(frame, r, "anisotropic") for r in range(2)])


def test_tensorstore_reads_through_its_http_kvstore(served: str, admin: APIClient) -> None:
    ts = pytest.importorskip("tensorstore")
    lo, hi = (10, 5, 3), (300, 200, 50)
    ds = make_frame_dataset(admin, "tst", lo=lo, hi=hi, voxel=(4.0, 4.0, 40.0), unit="nanometers",
                            method="anisotropic", levels=2, channels={"img16": "uint16", "ann64": "uint64"})
    assert admin.put("/v1/collection/tst/", {"public": True}, format="json").status_code == 200
    for channel in ("img16", "ann64"):
        levels = fill_levels(admin, ds, channel, Box(lo, hi), "anisotropic", 2)
        for res, ref in enumerate(levels):
            spec = {"driver": "neuroglancer_precomputed", "scale_index": res,
                    "kvstore": {"driver": "http", "base_url": f"{served}/precomputed/tst/e1/{channel}/",
                                "headers": ["Connection: close"]}}  # no idle connection outlives the test
            store = ts.open(spec, read=True).result()
            extent = level_extent(Box(lo, hi), res, "anisotropic")
            assert list(store.domain.inclusive_min[:3]) == list(extent.lo)
            assert list(store.domain.exclusive_max[:3]) == list(extent.hi)
            box = Box((max(extent.lo[0], extent.hi[0] - 150), extent.lo[1] + 3, extent.lo[2] + 2), extent.hi)
            got = store[box.lo[0]:box.hi[0], box.lo[1]:box.hi[1], box.lo[2]:box.hi[2], 0].read().result()
            np.testing.assert_array_equal(got, ref[box.slices_zyx(extent.lo)].transpose(2, 1, 0))


def test_a_path_with_a_line_break_is_a_json_404(admin: APIClient, ng: Dataset) -> None:
    """Found by the schema fuzzer: Django's path converters stop at a line break, so such a
    path fell through every route to Django's HTML page."""
    r = admin.get("/precomputed/c%0A/e/ch/compressed_segmentation/a%0A/0-1_0-1_0-1")
    assert r.status_code == 404 and r["Content-Type"] == "application/json"
    assert "no such precomputed file" in r.json()["message"]
