"""`/precomputed-sharded/`: the live volume as sharded precomputed, read by the real clients
(CloudVolume and TensorStore, both by Range) exactly: unaligned boxes, two levels, a frame that
does not start at 0, an image and a label channel; and what a Range costs."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core import precomputed
from ndstore.core.geometry import Box, level_extent
from tests.api.test_precomputed import (  # noqa: F401  (the live server fixture)
    check_reads,
    fill_levels,
    make_frame_dataset,
    served,
)

LO, HI = (10, 5, 3), (300, 200, 50)


@pytest.fixture
def sh(admin: APIClient) -> Any:
    ds = make_frame_dataset(admin, "sh", lo=LO, hi=HI, voxel=(4.0, 4.0, 40.0), unit="nanometers",
                            method="anisotropic", levels=2, channels={"img16": "uint16", "ann64": "uint64"})
    assert admin.put("/v1/collection/sh/", {"public": True}, format="json").status_code == 200
    return ds


def test_info_declares_sharding_per_advertised_scale(admin: APIClient, sh: Any) -> None:
    info = json.loads(admin.get("/precomputed-sharded/sh/e1/img16/info").content)
    assert [s["key"] for s in info["scales"]] == ["0"]
    sharding = info["scales"][0]["sharding"]
    assert sharding["@type"] == "neuroglancer_uint64_sharded_v1" and sharding["hash"] == "identity"
    assert info["scales"][0]["encoding"] == "raw"
    labels = json.loads(admin.get("/precomputed-sharded/sh/e1/ann64/info").content)["scales"][0]
    if precomputed.cseg_available():  # as the unsharded view; such a shard is encoded whole, so it is small
        assert labels["encoding"] == "compressed_segmentation" and labels["sharding"]["preshift_bits"] <= 3
    r = admin.get("/precomputed-sharded/sh/e1/img16/0/ff.shard")
    assert r.status_code == 404 and "no shard" in r.json()["message"]
    assert admin.get("/precomputed-sharded/sh/e1/img16/0/0-1_0-1_0-1").status_code == 404


def test_cloudvolume_reads_the_sharded_view_exactly(served: str, admin: APIClient, sh: Any) -> None:  # noqa: F811
    for channel in ("img16", "ann64"):
        levels = fill_levels(admin, sh, channel, Box(LO, HI), "anisotropic", 2)
        url = f"{served}/precomputed-sharded/sh/e1/{channel}"
        check_reads(url, levels, [level_extent(Box(LO, HI), r, "anisotropic") for r in range(2)])


def test_tensorstore_reads_the_sharded_view_exactly(served: str, admin: APIClient, sh: Any) -> None:  # noqa: F811
    ts = pytest.importorskip("tensorstore")
    levels = fill_levels(admin, sh, "ann64", Box(LO, HI), "anisotropic", 2)
    for res, ref in enumerate(levels):
        spec = {"driver": "neuroglancer_precomputed", "scale_index": res,
                "kvstore": {"driver": "http", "base_url": f"{served}/precomputed-sharded/sh/e1/ann64/",
                            "headers": ["Connection: close"]}}
        store = ts.open(spec, read=True).result()
        extent = level_extent(Box(LO, HI), res, "anisotropic")
        box = Box((extent.lo[0] + 7, extent.lo[1] + 3, extent.lo[2] + 2), extent.hi)
        got = store[box.lo[0]:box.hi[0], box.lo[1]:box.hi[1], box.lo[2]:box.hi[2], 0].read().result()
        np.testing.assert_array_equal(got, ref[box.slices_zyx(extent.lo)].transpose(2, 1, 0))


def test_a_range_of_the_indexes_reads_no_chunk_and_a_write_shows_at_once(admin: APIClient, sh: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.api.views import sharded as view

    fill_levels(admin, sh, "img16", Box(LO, HI), "anisotropic", 1)
    reads: list[Any] = []
    real = view.make_cutout
    monkeypatch.setattr(view, "make_cutout", lambda *a: reads.append(a[2]) or real(*a))
    index = admin.get("/precomputed-sharded/sh/e1/img16/0/0.shard", HTTP_RANGE="bytes=0-15")
    assert index.status_code == 206 and reads == []
    start, end = np.frombuffer(index.content, "<u8")
    minishard = admin.get("/precomputed-sharded/sh/e1/img16/0/0.shard", HTTP_RANGE=f"bytes={16 + start}-{15 + end}")
    assert minishard.status_code == 206 and reads == []
    n = len(minishard.content) // 24
    ids, offsets, sizes = np.frombuffer(minishard.content, "<u8").reshape(3, n)
    first = 16 + int(offsets[0])
    chunk = admin.get("/precomputed-sharded/sh/e1/img16/0/0.shard", HTTP_RANGE=f"bytes={first}-{first + sizes[0] - 1}")
    assert chunk.status_code == 206 and len(reads) == 1 and reads[0].lo == LO  # chunk 0: one cuboid read
    one = np.array([[[4242]]], "<u2")
    r = admin.generic("POST", sh.cutout("img16", 0, *zip(LO, (LO[0] + 1, LO[1] + 1, LO[2] + 1))), one.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201
    again = admin.get("/precomputed-sharded/sh/e1/img16/0/0.shard", HTTP_RANGE=f"bytes={first}-{first + 1}")
    assert np.frombuffer(again.content, "<u2")[0] == 4242


def test_a_label_shard_is_compressed_segmentation_with_an_etag_on_its_ranges(admin: APIClient, sh: Any) -> None:
    if not precomputed.cseg_available():
        pytest.skip("the compressed_segmentation codec is not installed")
    fill_levels(admin, sh, "ann64", Box(LO, HI), "anisotropic", 1)
    scale = json.loads(admin.get("/precomputed-sharded/sh/e1/ann64/info").content)["scales"][0]
    shard = f"/precomputed-sharded/sh/e1/ann64/0/{0:0{-(-scale['sharding']['shard_bits'] // 4)}x}.shard"
    whole = admin.get(shard)
    assert whole.status_code == 200
    index = admin.get(shard, HTTP_RANGE="bytes=0-15")
    assert index.status_code == 206 and index.content == whole.content[:16] and index["ETag"] == whole["ETag"]
    assert admin.get(shard, HTTP_RANGE="bytes=0-15",
                     HTTP_IF_NONE_MATCH=whole["ETag"]).status_code == 304
