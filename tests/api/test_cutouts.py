"""Cutouts through the HTTP API (Django's full request stack) against moto's S3 and DynamoDB:
for random unaligned boxes over many supercuboids, at several resolutions, dtypes and media
types, a write followed by a read returns exactly what a numpy reference holds."""

from __future__ import annotations

from typing import Any

import blosc
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ndstore.core import wire
from ndstore.core.geometry import Box, grid_for_level, level_extent
from tests.api.conftest import Dataset, make_dataset

FRAME = (1100, 700, 100)
MEDIA = list(wire.FORMATS)


def decode(response: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    assert response.status_code == 200, response.content
    media = response["Content-Type"]
    return wire.format_for(media).decode(response.content, shape, np.dtype(dtype))


@st.composite
def boxes(draw: st.DrawFn, extent: Box) -> Box:
    lo = [draw(st.integers(a, b - 1)) for a, b in zip(extent.lo, extent.hi)]
    hi = [draw(st.integers(a + 1, min(b, a + 600))) for a, b in zip(lo, extent.hi)]
    return Box(tuple(lo), tuple(hi))  # type: ignore[arg-type]


def test_random_writes_and_reads_match_numpy(admin: Any, dataset: Dataset) -> None:
    references: dict[tuple[str, int], np.ndarray] = {}

    @settings(max_examples=40)
    @given(channel=st.sampled_from(sorted(dataset.channels)), res=st.integers(0, 2),
           media_in=st.sampled_from(MEDIA), media_out=st.sampled_from(MEDIA), direct=st.booleans(),
           data=st.data())
    def run(channel: str, res: int, media_in: str, media_out: str, direct: bool, data: st.DataObject) -> None:
        dtype = dataset.channels[channel]
        extent = level_extent(Box((0, 0, 0), FRAME), res, "anisotropic")
        ref = references.setdefault((channel, res), np.zeros(extent.shape_zyx, dtype))
        box = data.draw(boxes(extent))
        assume(box.nvoxels * np.dtype(dtype).itemsize <= 48 << 20)  # an incompressible body stays under the limit
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
        # labels as segmentations hold them, a few dozen ids a box: with tens of thousands, each
        # write's label index rows (moto's DynamoDB, one request at a time) took minutes
        span = 64 if channel.startswith("ann") else 60000
        values = (rng.random(box.shape_zyx) * span).astype(dtype)
        values[rng.random(box.shape_zyx) < 0.4] = 0
        url = dataset.cutout(channel, res, *zip(box.lo, box.hi), direct=direct)
        body = wire.format_for(media_in).encode(values)
        r = admin.generic("POST", url, body, content_type=media_in)
        assert r.status_code == 201, r.content
        ref[box.slices_zyx()] = values
        probe = data.draw(boxes(extent))
        url = dataset.cutout(channel, res, *zip(probe.lo, probe.hi), direct=not direct)
        got = decode(admin.get(url, HTTP_ACCEPT=media_out), probe.shape_zyx, dtype)
        np.testing.assert_array_equal(got, ref[probe.slices_zyx()])

    run()


def test_intern_style_blosc_with_bit_width_typesize(admin: Any, dataset: Dataset) -> None:
    data = np.arange(16 * 100 * 130, dtype=np.uint16).reshape(16, 100, 130)
    url = dataset.cutout("img16", 0, (500, 630), (600, 700), (40, 56))
    body = blosc.compress(data, typesize=16)  # intern passes the bit width as typesize
    assert admin.generic("POST", url, body, content_type="application/blosc").status_code == 201
    r = admin.get(url, HTTP_ACCEPT="application/blosc")
    got = np.frombuffer(blosc.decompress(r.content), np.uint16).reshape(data.shape)  # as intern reads it
    np.testing.assert_array_equal(got, data)


def test_default_media_type_is_blosc(admin: Any, dataset: Dataset) -> None:
    r = admin.get(dataset.cutout("img8", 0, (0, 10), (0, 10), (0, 1)))
    assert r.status_code == 200 and r["Content-Type"] == "application/blosc"


def test_time_series_cutouts(admin: Any) -> None:
    ds = make_dataset(admin, name="tseries", frame=(300, 300, 20), times=5)
    data = np.random.default_rng(1).integers(1, 255, (3, 4, 50, 60), dtype=np.uint8)
    url = ds.cutout("img8", 0, (10, 70), (20, 70), (2, 6), t=(1, 4))
    assert admin.generic("POST", url, wire.FORMATS["application/npygz"].encode(data),
                         content_type="application/npygz").status_code == 201
    got = decode(admin.get(ds.cutout("img8", 0, (10, 70), (20, 70), (2, 6), t=(0, 5))), (5, 4, 50, 60), "uint8")
    np.testing.assert_array_equal(got[1:4], data)
    assert not got[0].any() and not got[4].any()
    # Without a time range a cutout is the default time sample, shaped (z, y, x).
    plain = decode(admin.get(url.rsplit("1:4/", 1)[0]), (4, 50, 60), "uint8")
    assert not plain.any()


def test_filter_keeps_only_named_ids(admin: Any, dataset: Dataset) -> None:
    labels = np.zeros((2, 8, 8), np.uint64)
    labels[0, :4] = 2**40 + 1
    labels[1, 4:] = 7
    labels[0, 4:, :2] = 9
    url = dataset.cutout("ann64", 0, (0, 8), (0, 8), (0, 2))
    admin.generic("POST", url, blosc.compress(labels, typesize=64), content_type="application/blosc")
    got = decode(admin.get(url + f"?filter={2**40 + 1},7"), (2, 8, 8), "uint64")
    np.testing.assert_array_equal(got, np.where(labels == 9, 0, labels))


def test_every_access_mode_reads_the_same(admin: Any, dataset: Dataset) -> None:
    url = dataset.cutout("img8", 0, (0, 20), (0, 20), (0, 2))
    admin.generic("POST", url, np.full((2, 20, 20), 3, np.uint8).tobytes(), content_type="application/octet-stream")
    for mode in ("cache", "no_cache", "raw"):
        assert decode(admin.get(f"{url}?access-mode={mode}"), (2, 20, 20), "uint8").min() == 3


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "float32"])
@pytest.mark.parametrize("direct", [False, True])
def test_box_across_eight_supercuboids(admin: Any, dataset: Dataset, dtype: str, direct: bool) -> None:
    channel = {"uint8": "img8", "uint16": "img16", "uint32": "img32", "uint64": "ann64", "float32": "f32"}[dtype]
    sc = grid_for_level("anisotropic", 0, np.dtype(dtype).itemsize).supercuboid
    lo = [s - d for s, d in zip(sc, (37, 21, 3))]
    hi = [s + d for s, d in zip(sc, (45, 19, 2))]
    shape = (hi[2] - lo[2], hi[1] - lo[1], hi[0] - lo[0])
    rng = np.random.default_rng(5)
    if dtype == "uint64":  # a label channel: a few hundred segments, with ids past 2^32 and 2^53
        data = rng.choice(rng.integers(1 << 40, 1 << 63, 300, dtype=np.uint64), shape)
    else:
        data = (rng.random(shape) * 1e6).astype(dtype)
    url = dataset.cutout(channel, 0, *zip(lo, hi), direct=direct)
    r = admin.generic("POST", url, wire.FORMATS["application/blosc"].encode(data), content_type="application/blosc")
    assert r.status_code == 201
    np.testing.assert_array_equal(decode(admin.get(url), shape, dtype), data)
    wider = dataset.cutout(channel, 0, *zip([a - 5 for a in lo], [b + 5 for b in hi]), direct=not direct)
    got = decode(admin.get(wider), tuple(s + 10 for s in shape), dtype)
    np.testing.assert_array_equal(got[5:-5, 5:-5, 5:-5], data)
    assert not got[:5].any() and not got[:, :, -5:].any()


def test_cache_and_direct_paths_stay_coherent(admin: Any, dataset: Dataset) -> None:
    from ndstore import wiring

    box = ((100, 700), (200, 600), (30, 70))  # spans supercuboids in x and z
    shape = (40, 400, 600)
    cached = np.random.default_rng(8).integers(1, 255, shape, dtype=np.uint8)
    assert admin.generic("POST", dataset.cutout("img8", 0, *box), cached.tobytes(),
                         content_type="application/octet-stream").status_code == 201
    # A direct read sees the acknowledged cached write (it is written back first).
    np.testing.assert_array_equal(decode(admin.get(dataset.cutout("img8", 0, *box, direct=True)), shape, "uint8"),
                                  cached)
    # A direct write leaves no stale cached copy readable.
    direct = np.full(shape, 9, np.uint8)
    assert admin.generic("POST", dataset.cutout("img8", 0, *box, direct=True), direct.tobytes(),
                         content_type="application/octet-stream").status_code == 201
    np.testing.assert_array_equal(decode(admin.get(dataset.cutout("img8", 0, *box)), shape, "uint8"), direct)
    # raw reads the base tier as it is; no_cache writes back first.
    partial = np.full((1, 10, 10), 5, np.uint8)
    admin.generic("POST", dataset.cutout("img8", 0, (100, 110), (200, 210), (30, 31)), partial.tobytes(),
                  content_type="application/octet-stream")
    small = dataset.cutout("img8", 0, (100, 110), (200, 210), (30, 31))
    assert decode(admin.get(small + "?access-mode=raw"), (1, 10, 10), "uint8").max() == 9
    assert decode(admin.get(small + "?access-mode=no_cache"), (1, 10, 10), "uint8").max() == 5
    assert decode(admin.get(small + "?access-mode=raw"), (1, 10, 10), "uint8").max() == 5
    assert wiring.services().cache_tier.upkeep.occupancy()[1] == 0
