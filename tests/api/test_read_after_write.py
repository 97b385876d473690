"""A write acknowledged through any path shows at once in every view (DESIGN §5): every read of
voxels goes through the data plane's front door (ndstore/engine/dataplane.py), which sees the
writes still pending in NDBlaze. Before it, `/v1/image/` slices and `/v1/cutout/` reads did not
show a pending NDBlaze write until a merge ran."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ndstore.core import wire
from tests.api.conftest import Dataset, make_dataset

WRITE_PATHS = ["/v1/cutout/", "/v1/direct/cutout/", "/v1/blaze/cutout/"]
X, Y, Z = 70, 40, 5  # the voxel each test writes: inside the first chunk of every view


@pytest.fixture
def data(admin: Any) -> Dataset:
    return make_dataset(admin, "raw", frame=(256, 128, 16), levels=2, channels={"img8": "uint8", "ann64": "uint64"})


def _write(admin: Any, data: Dataset, path: str, channel: str, value: np.ndarray) -> None:
    url = data.cutout(channel, 0, (X, X + 1), (Y, Y + 1), (Z, Z + 1)).replace("/v1/cutout/", path)
    r = admin.generic("POST", url, wire.format_for("application/blosc").encode(value), content_type="application/blosc")
    assert r.status_code == 201, r.content


def _voxel_views(admin: Any, data: Dataset, channel: str, dtype: str) -> dict[str, int]:
    """The written voxel as each view that answers voxels serves it."""
    one = data.cutout(channel, 0, (X, X + 1), (Y, Y + 1), (Z, Z + 1))
    cutouts = {"cutout": one, "cutout no_cache": f"{one}?access-mode=no_cache",
               "direct": one.replace("/v1/cutout/", "/v1/direct/cutout/"),
               "blaze": one.replace("/v1/cutout/", "/v1/blaze/cutout/")}
    seen: dict[str, int] = {}
    for view, url in cutouts.items():
        r = admin.get(url, HTTP_ACCEPT="application/octet-stream")
        assert r.status_code == 200, (view, r.content)
        seen[view] = int(np.frombuffer(r.content, dtype)[0])
    chunk = admin.get(f"/precomputed/raw/e1/{channel}/raw/0/{X}-{X + 1}_{Y}-{Y + 1}_{Z}-{Z + 1}")
    assert chunk.status_code == 200, chunk.content
    seen["precomputed"] = int(np.frombuffer(chunk.content, "<" + np.dtype(dtype).str[1:])[0])
    if dtype == "uint8":
        for plane, box in (("xy", f"{X}:{X + 1}/{Y}:{Y + 1}/{Z}"), ("xz", f"{X}:{X + 1}/{Y}/{Z}:{Z + 1}"),
                           ("yz", f"{X}/{Y}:{Y + 1}/{Z}:{Z + 1}")):
            image = admin.get(f"/v1/image/raw/e1/{channel}/{plane}/0/{box}/")
            assert image.status_code == 200, (plane, image.content)
            seen[f"image {plane}"] = int(np.asarray(Image.open(io.BytesIO(image.content))).reshape(-1)[0])
    return seen


def _chunk_files(admin: Any, channel: str) -> dict[str, Any]:
    """The whole first chunk (or shard) of the views that serve files: it changes with the voxel."""
    zarr_chunk = admin.get(f"/zarr/raw/e1/{channel}/0/zarr.json").json()["chunk_grid"]["configuration"]["chunk_shape"]
    urls = {"sharded": f"/precomputed-sharded/raw/e1/{channel}/0/0.shard",
            "zarr": f"/zarr/raw/e1/{channel}/0/c/0/{Z // zarr_chunk[1]}/{Y // zarr_chunk[2]}/{X // zarr_chunk[3]}"}
    return {view: admin.get(url) for view, url in urls.items()}


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_a_write_through_any_path_shows_at_once_in_every_view(admin: Any, data: Dataset, path: str) -> None:
    before = _chunk_files(admin, "img8")
    assert before["sharded"].status_code == 200 and before["zarr"].status_code == 404  # zarr: no chunk, fill value
    assert set(_voxel_views(admin, data, "img8", "uint8").values()) == {0}
    _write(admin, data, path, "img8", np.array([[[201]]], np.uint8))
    seen = _voxel_views(admin, data, "img8", "uint8")
    assert seen == dict.fromkeys(seen, 201), (path, seen)
    after = _chunk_files(admin, "img8")
    for view, r in after.items():
        assert r.status_code == 200 and r["ETag"] != before[view].get("ETag"), view
        assert r.content != before[view].content, view
    raw = admin.get(data.cutout("img8", 0, (X, X + 1), (Y, Y + 1), (Z, Z + 1)) + "?access-mode=raw",
                    HTTP_ACCEPT="application/octet-stream")
    # raw is the base tier as it is: a buffered write is not there until merged (a cached one was
    # written back by the no_cache and direct reads above)
    assert raw.content == (b"\x00" if path == "/v1/blaze/cutout/" else b"\xc9")


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_label_reads_see_a_write_through_any_path_at_once(admin: Any, data: Dataset, path: str) -> None:
    """ids and boundingbox are reads too: a pending NDBlaze label counts, where no supercuboid of
    the level is stored yet."""
    label = (1 << 40) + 7
    _write(admin, data, path, "ann64", np.array([[[label]]], np.uint64))
    seen = _voxel_views(admin, data, "ann64", "uint64")
    assert seen == dict.fromkeys(seen, label), (path, seen)
    ids = admin.get("/v1/ids/raw/e1/ann64/0/0:256/0:128/0:16/")
    assert ids.status_code == 200 and ids.json() == {"ids": [str(label)]}, ids.content
    box = admin.get(f"/v1/boundingbox/raw/e1/ann64/0/{label}/?type=tight")
    assert box.status_code == 200, box.content
    assert box.json() == {"x_range": [X, X + 1], "y_range": [Y, Y + 1], "z_range": [Z, Z + 1], "t_range": [0, 1]}


def test_a_later_ndblaze_write_wins_in_every_view_as_its_merge_will(admin: Any, data: Dataset) -> None:
    """A cache write under a pending NDBlaze write is overwritten when the merge applies it: every
    view shows the voxels as they will be, not one state now and another after the merge."""
    _write(admin, data, "/v1/blaze/cutout/", "img8", np.array([[[9]]], np.uint8))
    _write(admin, data, "/v1/cutout/", "img8", np.array([[[200]]], np.uint8))
    seen = _voxel_views(admin, data, "img8", "uint8")
    assert seen == dict.fromkeys(seen, 9), seen
    _write(admin, data, "/v1/blaze/cutout/", "img8", np.array([[[77]]], np.uint8))
    seen = _voxel_views(admin, data, "img8", "uint8")
    assert seen == dict.fromkeys(seen, 77), seen


def test_the_first_write_to_a_level_advertises_it_on_every_path(admin: Any, data: Dataset) -> None:
    """Which levels hold data is the data plane's too: each write path marks its level."""
    for path in WRITE_PATHS:
        info = admin.get("/precomputed/raw/e1/img8/info").json()
        assert [s["key"] for s in info["scales"]] == ["0"], path
        url = f"{path}raw/e1/img8/1/0:1/0:1/0:1/"
        r = admin.generic("POST", url, wire.format_for("application/blosc").encode(np.ones((1, 1, 1), np.uint8)),
                          content_type="application/blosc")
        assert r.status_code == 201, r.content
        info = admin.get("/precomputed/raw/e1/img8/info").json()
        assert [s["key"] for s in info["scales"]] == ["0", "1"], path
        admin.delete("/v1/collection/raw/experiment/e1/channel/img8/")
        assert admin.post("/v1/collection/raw/experiment/e1/channel/img8/", {"type": "image", "datatype": "uint8"},
                          format="json").status_code == 201
