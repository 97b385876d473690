"""Direct I/O against the base tier: any sequence of writes of arbitrary (unaligned,
multi-supercuboid) boxes reads back exactly as a numpy reference holds it."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndstore.core.errors import InvalidRequest, OutOfBounds, PayloadTooLarge
from ndstore.core.geometry import Box
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.volume import ChannelVolume, make_cutout
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.locks import LocalLocks
from ndstore.storage.s3 import S3ObjectStore
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex

DTYPES = ["uint8", "uint16", "uint32", "uint64", "float32"]
LIMIT = 1 << 34
CHANNEL_IDS = itertools.count(1000)  # a fresh volume per example: stores outlive examples


def channel(dtype: str, method: str = "anisotropic", times: int = 1, cid: int = 1) -> ChannelVolume:
    probe = ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), (1, 1, 1)), 3, method, times)  # type: ignore[arg-type]
    sc = probe.grid(0).supercuboid
    frame = Box((0, 0, 0), (sc[0] + 90, sc[1] // 2 + 40, sc[2] + sc[2] // 2))
    return ChannelVolume(1, 1, cid, np.dtype(dtype), frame, 3, method, times)  # type: ignore[arg-type]


@pytest.fixture(params=["local", "moto"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> BaseTier:
    if request.param == "local":
        objects, index = FileObjectStore(tmp_path / "o", fsync=False), SqliteSupercuboidIndex(tmp_path / "i.db")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        name = uuid.uuid4().hex[:12]
        objects, index = S3ObjectStore(f"b-{name}", endpoint), DynamoSupercuboidIndex(f"t-{name}", endpoint)
    objects.ensure_ready()
    index.ensure_ready()
    return BaseTier(objects, index, LocalLocks())


@st.composite
def box_in(draw: st.DrawFn, extent: Box) -> Box:
    lo = [draw(st.integers(a, b - 1)) for a, b in zip(extent.lo, extent.hi)]
    hi = [draw(st.integers(a + 1, min(b, a + 300))) for a, b in zip(lo, extent.hi)]
    return Box(tuple(lo), tuple(hi))  # type: ignore[arg-type]


@settings(max_examples=15)
@given(dtype=st.sampled_from(DTYPES), method=st.sampled_from(["anisotropic", "isotropic"]),
       resolution=st.integers(0, 2), data=st.data())
def test_writes_then_reads_match_numpy(tier: BaseTier, dtype: str, method: str, resolution: int,
                                       data: st.DataObject) -> None:
    chan = channel(dtype, method, cid=next(CHANNEL_IDS))
    extent = chan.extent(resolution)
    reference = np.zeros(extent.shape_zyx, dtype)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    for _ in range(data.draw(st.integers(1, 3))):
        box = data.draw(box_in(extent))
        values = (rng.random(box.shape_zyx) * 50000).astype(dtype)
        values[rng.random(box.shape_zyx) < 0.3] = 0
        tier.write(make_cutout(chan, resolution, box, range(1), LIMIT), values[np.newaxis])
        reference[box.slices_zyx(extent.lo)] = values
        probe = data.draw(box_in(extent))
        got = tier.read(make_cutout(chan, resolution, probe, range(1), LIMIT))[0]
        np.testing.assert_array_equal(got, reference[probe.slices_zyx(extent.lo)])
    whole = tier.read(make_cutout(chan, resolution, extent, range(1), LIMIT))[0]
    np.testing.assert_array_equal(whole, reference)


def test_zeroing_a_supercuboid_deletes_it_from_store_and_index(tier: BaseTier) -> None:
    chan = channel("uint16", cid=77)
    sc = chan.grid(0).supercuboid
    box = Box((10, 10, 1), (sc[0] + 20, 30, 5))  # spans two supercuboids in x
    cut = make_cutout(chan, 0, box, range(1), LIMIT)
    tier.write(cut, np.full(cut.shape, 9, np.uint16))
    volume = chan.volume_key(0, 0)
    assert tier.index.mortons(volume) == [0, 1]
    tier.write(cut, np.zeros(cut.shape, np.uint16))
    assert tier.index.mortons(volume) == []
    assert dict(tier.objects.get_many([volume.supercuboid(0).object_key]))[volume.supercuboid(0).object_key] is None
    assert not tier.read(cut).any()


def test_empty_regions_read_as_zeros_and_store_nothing(tier: BaseTier) -> None:
    chan = channel("float32", cid=78)
    cut = make_cutout(chan, 0, Box((0, 0, 0), (50, 60, 7)), range(1), LIMIT)
    tier.write(cut, np.zeros(cut.shape, np.float32))
    assert tier.index.mortons(chan.volume_key(0, 0)) == []
    assert tier.read(cut).shape == (1, 7, 60, 50)


def test_time_samples_are_separate_volumes(tier: BaseTier) -> None:
    chan = channel("uint8", times=4, cid=79)
    box = Box((0, 0, 0), (40, 40, 4))
    cut = make_cutout(chan, 0, box, range(1, 3), LIMIT)
    data = np.stack([np.full(box.shape_zyx, 5, np.uint8), np.full(box.shape_zyx, 6, np.uint8)])
    tier.write(cut, data)
    got = tier.read(make_cutout(chan, 0, box, range(0, 4), LIMIT))
    assert [int(got[t].max()) for t in range(4)] == [0, 5, 6, 0]


def test_purge_removes_every_level_and_time(tier: BaseTier) -> None:
    chan = channel("uint8", times=2, cid=80)
    for res, t in [(0, 0), (1, 1), (2, 0)]:
        cut = make_cutout(chan, res, Box((0, 0, 0), (8, 8, 2)), range(t, t + 1), LIMIT)
        tier.write(cut, np.ones(cut.shape, np.uint8))
    assert tier.purge(chan) == 3
    assert all(tier.index.mortons(chan.volume_key(r, t)) == [] for r in range(3) for t in range(2))


def test_requests_are_validated_with_clear_messages() -> None:
    chan = channel("uint8")
    with pytest.raises(InvalidRequest, match="resolution 3 does not exist"):
        make_cutout(chan, 3, Box((0, 0, 0), (1, 1, 1)), range(1), LIMIT)
    with pytest.raises(InvalidRequest, match="time range 1:2"):
        make_cutout(chan, 0, Box((0, 0, 0), (1, 1, 1)), range(1, 2), LIMIT)
    with pytest.raises(OutOfBounds):
        make_cutout(chan, 0, Box((0, 0, 0), (1, 1, 10**6)), range(1), LIMIT)
    with pytest.raises(PayloadTooLarge, match="limit per request"):
        make_cutout(chan, 0, Box((0, 0, 0), (100, 100, 10)), range(1), 1000)
