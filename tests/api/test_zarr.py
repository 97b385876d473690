"""`/zarr/`: the live volume as Zarr v3 + OME-Zarr 0.5, read by the real clients (zarr-python 3
over fsspec's HTTP, TensorStore's zarr3 driver) exactly, unaligned boxes, two levels, two time
samples, a frame that does not start at 0; and what the files say."""

from __future__ import annotations

import json

import blosc
import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core.chunks import compress_cuboid
from ndstore.core.geometry import Box, level_extent
from ndstore.core.synthetic import em_like
from tests.api.conftest import Dataset, make_dataset
from tests.api.test_precomputed import random_volume, served  # noqa: F401  (the live server fixture)

LO, HI = (10, 5, 3), (300, 200, 21)
FRAME = Box(LO, HI)


def fill(client: APIClient, ds: Dataset, channel: str, levels: int, times: int) -> list[np.ndarray]:
    """Random voxels over every level's extent and every time sample; each level as (t, z, y, x)."""
    out = []
    for res in range(levels):
        extent = level_extent(FRAME, res, "anisotropic")
        data = random_volume((times, *extent.shape_zyx), ds.channels[channel], seed=10 + res)
        url = ds.cutout(channel, res, *zip(extent.lo, extent.hi), t=(0, times))
        r = client.generic("POST", url, data.tobytes(), content_type="application/octet-stream")
        assert r.status_code == 201, r.content
        out.append(data)
    return out


@pytest.fixture
def zr(admin: APIClient) -> Dataset:
    fields = {"x_start": LO[0], "y_start": LO[1], "z_start": LO[2], "x_voxel_size": 4.0, "y_voxel_size": 4.0,
              "z_voxel_size": 40.0, "voxel_unit": "nanometers"}
    return make_dataset(admin, "zr", HI, levels=3, times=2, channels={"img16": "uint16", "ann64": "uint64"},
                        frame_fields=fields)


def test_the_group_and_arrays_describe_the_advertised_levels(admin: APIClient, zr: Dataset) -> None:
    fill(admin, zr, "img16", 2, 2)  # level 2 is declared but holds nothing
    group = json.loads(admin.get("/zarr/zr/e1/img16/zarr.json").content)
    assert (group["zarr_format"], group["node_type"]) == (3, "group")
    ms = group["attributes"]["ome"]["multiscales"][0]
    assert group["attributes"]["ome"]["version"] == "0.5"
    assert [a["name"] for a in ms["axes"]] == ["t", "z", "y", "x"]
    assert [a.get("unit") for a in ms["axes"]] == [None, "nanometer", "nanometer", "nanometer"]
    assert [d["path"] for d in ms["datasets"]] == ["0", "1"]
    scale, translation = ms["datasets"][1]["coordinateTransformations"]
    assert scale == {"type": "scale", "scale": [1.0, 40.0, 8.0, 8.0]}
    assert translation == {"type": "translation", "translation": [0.0, 3 * 40.0, 2 * 8.0, 5 * 8.0]}
    array = json.loads(admin.get("/zarr/zr/e1/img16/1/zarr.json").content)
    assert array["shape"] == [2, 18, 98, 145] and array["data_type"] == "uint16"
    assert array["chunk_grid"]["configuration"]["chunk_shape"] == [1, 8, 128, 128]
    assert array["fill_value"] == 0 and array["dimension_names"] == ["t", "z", "y", "x"]
    for missing, says in [("2/zarr.json", "levels that hold data"), ("0/c/2/0/0/0", "no chunk"),
                          ("0/c/0/0/0/3", "no chunk"), (".zgroup", "no such zarr file"),
                          ("zarr.json/x", "no such zarr file")]:
        r = admin.get(f"/zarr/zr/e1/img16/{missing}")
        assert r.status_code == 404 and says in r.json()["message"], (missing, r.content)


def test_zarr_python_reads_every_level_exactly(served: str, admin: APIClient, zr: Dataset) -> None:  # noqa: F811
    zarr = pytest.importorskip("zarr")
    assert admin.put("/v1/collection/zr/", {"public": True}, format="json").status_code == 200
    levels = fill(admin, zr, "img16", 2, 2)
    group = zarr.open_group(f"{served}/zarr/zr/e1/img16", mode="r")
    assert group.attrs["ome"]["multiscales"][0]["datasets"][0]["path"] == "0"
    for res, ref in enumerate(levels):
        array = group[str(res)]
        assert array.shape == ref.shape
        np.testing.assert_array_equal(array[:], ref)
        np.testing.assert_array_equal(array[1, 2:7, 17:90, 33:141], ref[1, 2:7, 17:90, 33:141])


def test_tensorstore_zarr3_reads_a_private_channel_with_its_token(served: str, admin: APIClient,  # noqa: F811
                                                                  zr: Dataset) -> None:
    ts = pytest.importorskip("tensorstore")
    labels = fill(admin, zr, "ann64", 2, 2)
    token = admin._credentials["HTTP_AUTHORIZATION"]
    for res, ref in enumerate(labels):
        spec = {"driver": "zarr3", "kvstore": {"driver": "http", "base_url": f"{served}/zarr/zr/e1/ann64/{res}/",
                                                "headers": [f"Authorization: {token}", "Connection: close"]}}
        store = ts.open(spec, read=True).result()
        assert store.dtype.name == "uint64" and list(store.shape) == list(ref.shape)
        got = store[0, 1:6, 3:70, 100:140].read().result()
        np.testing.assert_array_equal(got, ref[0, 1:6, 3:70, 100:140])
        np.testing.assert_array_equal(store.read().result(), ref)
    refused = ts.open({"driver": "zarr3", "kvstore": {"driver": "http", "headers": ["Connection: close"],
                                                      "base_url": f"{served}/zarr/zr/e1/ann64/0/"}}, read=True)
    with pytest.raises(Exception, match="401|403|[Pp]ermission|[Uu]nauthori"):
        refused.result()


def test_a_write_is_visible_through_the_zarr_view_at_once(admin: APIClient, zr: Dataset) -> None:
    fill(admin, zr, "img16", 1, 2)
    chunk = "/zarr/zr/e1/img16/0/c/1/0/0/0"
    before = admin.get(chunk)
    assert before.status_code == 200 and len(blosc.decompress(before.content)) == 8 * 128 * 128 * 2
    r = admin.generic("POST", zr.cutout("img16", 0, (10, 11), (5, 6), (3, 4), t=(1, 2)),
                      np.array([7], "<u2").tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201
    after = admin.get(chunk, HTTP_IF_NONE_MATCH=before["ETag"])
    assert after.status_code == 200 and np.frombuffer(blosc.decompress(after.content), "<u2")[0] == 7
    assert blosc.decompress(after.content)[2:] == blosc.decompress(before.content)[2:]


def test_a_chunk_on_the_cuboid_grid_is_the_stored_cuboid_as_stored(admin: APIClient, zr: Dataset) -> None:
    """No decode, no encode: the chunk's bytes are the blob in the cache, once it is resident;
    a frame that does not start on a cuboid boundary has its chunks compressed per request."""
    levels = fill(admin, zr, "img16", 1, 2)  # the frame starts at x 10, y 5, z 3: off the grid
    aligned = make_dataset(admin, name="zal", levels=1)
    values = em_like((16, 128, 128), seed=4)
    r = admin.generic("POST", aligned.cutout("img8", 0, (0, 128), (0, 128), (0, 16)), values.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    cuboid = compress_cuboid(values)  # what the write stored: deterministic, one blosc thread
    got = admin.get(f"/zarr/{aligned.collection}/{aligned.experiment}/img8/0/c/0/0/0/0")
    assert got.status_code == 200 and got.content == cuboid
    off_grid = admin.get("/zarr/zr/e1/img16/0/c/1/0/0/0")
    chunk = np.frombuffer(blosc.decompress(off_grid.content), "<u2").reshape(8, 128, 128)
    np.testing.assert_array_equal(chunk, levels[0][1, 0:8, 0:128, 0:128])


def test_an_all_zero_chunk_is_a_404_that_readers_take_for_the_fill_value(served: str, admin: APIClient,  # noqa: F811
                                                                        zr: Dataset) -> None:
    zarr = pytest.importorskip("zarr")
    assert admin.put("/v1/collection/zr/", {"public": True}, format="json").status_code == 200
    r = admin.generic("POST", zr.cutout("img16", 0, (140, 141), (5, 6), (3, 4), t=(1, 2)),
                      np.array([9], "<u2").tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201
    assert admin.get("/zarr/zr/e1/img16/0/c/1/0/0/1").status_code == 200  # x 138..266 holds the voxel
    for empty in ("0/c/1/0/0/0", "0/c/0/0/0/1"):
        r = admin.get(f"/zarr/zr/e1/img16/{empty}")
        assert r.status_code == 404 and "fill value" in r.json()["message"], r.content
        assert admin.head(f"/zarr/zr/e1/img16/{empty}").status_code == 404
    expected = np.zeros((2, 18, 195, 290), np.uint16)
    expected[1, 0, 0, 130] = 9
    np.testing.assert_array_equal(zarr.open_group(f"{served}/zarr/zr/e1/img16", mode="r")["0"][:], expected)
    r = admin.generic("POST", zr.cutout("img16", 0, (140, 141), (5, 6), (3, 4), t=(1, 2)),
                      np.array([0], "<u2").tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201 and admin.get("/zarr/zr/e1/img16/0/c/1/0/0/1").status_code == 404
