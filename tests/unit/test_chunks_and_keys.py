from typing import Any

import blosc2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndstore.core import chunks
from ndstore.core.errors import DataCorrupt
from ndstore.core.geometry import Box
from ndstore.core.keys import SupercuboidKey, VolumeKey

CUBOID = (8, 8, 4)
COUNTS = (4, 4, 4)
SHAPE_ZYX = (16, 32, 32)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["uint8", "uint16", "uint32", "uint64", "float32"]), st.integers(0, 2**31), st.data())
def test_supercuboid_round_trip_of_any_region(dtype: str, seed: int, data: st.DataObject) -> None:
    rng = np.random.default_rng(seed)
    array = (rng.random(SHAPE_ZYX) * 1000).astype(dtype)
    array[rng.random(SHAPE_ZYX) < 0.5] = 0
    array[:, :8, :8] = 0  # some all-zero cuboids
    obj = chunks.encode_supercuboid(array, CUBOID, COUNTS)
    assert obj is not None
    lo = [data.draw(st.integers(0, s - 1)) for s in (32, 32, 16)]
    hi = [data.draw(st.integers(a + 1, s)) for a, s in zip(lo, (32, 32, 16))]
    region = Box(tuple(lo), tuple(hi))  # type: ignore[arg-type]
    out = np.full(region.shape_zyx, 7, dtype)
    chunks.decode_supercuboid_region(obj, region, out)
    np.testing.assert_array_equal(out, array[region.slices_zyx()])


@pytest.mark.parametrize("dtype", ["uint8", "uint64"])
def test_cuboids_stored_as_blosc2_frames_before_read_the_same(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuboids are written as c-blosc 1.x frames (what zarr's blosc codec reads); objects written
    before, with blosc2 frames, still decode, whole and in part."""
    array = (np.random.default_rng(3).random(SHAPE_ZYX) * 1000).astype(dtype)
    current = chunks.encode_supercuboid(array, CUBOID, COUNTS)
    monkeypatch.setattr(chunks, "compress_cuboid", lambda c: blosc2.compress(
        np.ascontiguousarray(c), typesize=c.dtype.itemsize, clevel=1, filter=blosc2.Filter.SHUFFLE,
        codec=blosc2.Codec.LZ4) if c.any() else b"")
    older = chunks.encode_supercuboid(array, CUBOID, COUNTS)
    assert current is not None and older is not None and current != older
    assert all(chunks.is_blosc1(b) for b in chunks.split_supercuboid(current)[3] if b)
    assert not any(chunks.is_blosc1(b) for b in chunks.split_supercuboid(older)[3] if b)
    for obj in (current, older):
        np.testing.assert_array_equal(chunks.decode_supercuboid(obj), array)
        out = np.zeros((5, 9, 11), dtype)
        chunks.decode_supercuboid_region(obj, Box((3, 4, 2), (14, 13, 7)), out)
        np.testing.assert_array_equal(out, array[2:7, 4:13, 3:14])


def test_all_zero_supercuboid_is_not_stored() -> None:
    assert chunks.encode_supercuboid(np.zeros(SHAPE_ZYX, np.uint16), CUBOID, COUNTS) is None


def test_corrupt_objects_are_refused() -> None:
    obj = chunks.encode_supercuboid(np.ones(SHAPE_ZYX, np.uint8), CUBOID, COUNTS)
    assert obj is not None
    with pytest.raises(DataCorrupt, match="bad magic"):
        chunks.split_supercuboid(b"XXXX" + obj[4:])
    with pytest.raises(DataCorrupt, match="truncated"):
        chunks.split_supercuboid(obj[:-3])


@given(*(st.integers(0, 2**31) for _ in range(5)), st.integers(0, 2**63 - 1))
def test_object_key_round_trip(c: int, e: int, ch: int, r: int, t: int, m: int) -> None:
    key = SupercuboidKey(VolumeKey(c, e, ch, r, t), m)
    parsed = SupercuboidKey.parse(key.object_key)
    assert parsed == key
    assert VolumeKey.parse_partition(key.volume.partition) == key.volume
    assert SupercuboidKey.from_name(key.name) == key
    assert len(key.object_key.split("&")[0]) == 8


def test_tampered_key_is_refused() -> None:
    key = SupercuboidKey(VolumeKey(1, 2, 3, 0, 0), 99).object_key
    with pytest.raises(ValueError, match="hash prefix"):
        SupercuboidKey.parse(key.replace("&99", "&98"))
    with pytest.raises(ValueError, match="not a supercuboid"):
        SupercuboidKey.parse("nonsense")


@settings(max_examples=200, deadline=None)
@given(st.tuples(*[st.integers(-8, 40)] * 3), st.tuples(*[st.integers(1, 40)] * 3))
def test_cuboids_touching_visits_exactly_the_cuboids_a_region_overlaps(lo: tuple[int, int, int],
                                                                      size: tuple[int, int, int]) -> None:
    region = Box(lo, (lo[0] + size[0], lo[1] + size[1], lo[2] + size[2]))
    every = tuple((n, box, part) for n, box in enumerate(chunks.cuboid_boxes(CUBOID, COUNTS))
                  if (part := region.intersect(box)) is not None)
    assert chunks.cuboids_touching(region, CUBOID, COUNTS) == every
    assert chunks.cuboids_touching(region, CUBOID, COUNTS) == every  # the same from the process's cache


def test_a_damaged_cuboid_is_refused_with_a_named_error_not_decoded() -> None:
    """Truncated, cut to its header, or zeroed after it: DataCorrupt (500, the stored bytes are
    damaged, not the request) naming the cuboid, never a bare codec error nor voxels decoded
    from damaged bytes."""
    cuboid = np.arange(4 * 8 * 8, dtype=np.uint16).reshape(4, 8, 8)
    blob = chunks.compress_cuboid(cuboid)
    for damaged in (blob[:-5], blob[:20], blob[:16] + bytes(len(blob) - 16), b"not blosc at all"):
        with pytest.raises(DataCorrupt, match="cuboid"):
            chunks.decompress_cuboid(damaged, np.dtype(np.uint16), (4, 8, 8))


def test_a_pool_gets_a_few_batches_of_cuboids_in_order_not_a_task_per_cuboid() -> None:
    from concurrent.futures import ThreadPoolExecutor

    handed: list[int] = []

    def counting_map(fn: Any, runs: Any) -> Any:
        runs = list(runs)
        handed.append(len(runs))
        return map(fn, runs)

    assert chunks.in_batches(counting_map, lambda x: x * 2, list(range(1000))) == [x * 2 for x in range(1000)]
    assert chunks.in_batches(counting_map, lambda x: x, [7]) == [7]
    assert chunks.in_batches(counting_map, lambda x: x, []) == []
    assert max(handed) <= chunks.BATCHES
    rng = np.random.default_rng(4)
    array = (rng.random(SHAPE_ZYX) * 1000).astype(np.uint16)
    with ThreadPoolExecutor(3) as pool:
        obj = chunks.encode_supercuboid(array, CUBOID, COUNTS, pool.map)
        assert obj is not None
        out = np.zeros(SHAPE_ZYX, np.uint16)
        chunks.decode_supercuboid_region(obj, Box((0, 0, 0), (32, 32, 16)), out, pool.map)
    np.testing.assert_array_equal(out, array)
