import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ndstore.core import geometry
from ndstore.core.errors import InvalidRequest, OutOfBounds
from ndstore.core.geometry import (
    CUBOID_BYTES,
    Box,
    Grid,
    check_inside,
    cuboid_shape,
    grid_for_level,
    level_extent,
    plan_supercuboids,
)


@st.composite
def boxes(draw: st.DrawFn, limit: int = 400) -> Box:
    lo = [draw(st.integers(0, limit)) for _ in range(3)]
    size = [draw(st.integers(1, 200)) for _ in range(3)]
    return Box(tuple(lo), tuple(a + s for a, s in zip(lo, size)))  # type: ignore[arg-type]


@given(boxes())
def test_plan_tiles_the_box_exactly(box: Box) -> None:
    grid = Grid((64, 64, 8))
    cover = np.zeros(box.shape_zyx, np.uint8)
    parts = plan_supercuboids(box, grid)
    for part in parts:
        assert grid.supercuboid_box(part.index).contains(part.region)
        cover[part.in_box(box)] += 1
        assert part.full == (part.region == grid.supercuboid_box(part.index))
        local = part.local_region(grid)
        assert local.shape_zyx == part.region.shape_zyx and min(local.lo) >= 0
    assert (cover == 1).all()
    assert [p.morton for p in parts] == sorted(p.morton for p in parts)


@given(boxes(limit=2000))
def test_small_plans_in_plain_python_match_the_vectorised_plan(box: Box) -> None:
    grid = Grid((16, 16, 2))  # supercuboids of 64x64x8: boxes here touch 1 to ~300 of them
    scalar = plan_supercuboids(box, grid)
    limit = geometry._SCALAR_PLAN
    geometry._SCALAR_PLAN = 0
    try:
        vectorised = plan_supercuboids(box, grid)
    finally:
        geometry._SCALAR_PLAN = limit
    assert scalar == vectorised
    assert all(type(p.morton) is int for p in scalar + vectorised)


@pytest.mark.parametrize("method", ["anisotropic", "isotropic"])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_cuboids_hold_256_kib_whatever_the_dtype(method: str, itemsize: int) -> None:
    shape = cuboid_shape(method, itemsize)  # type: ignore[arg-type]
    assert np.prod(shape) * itemsize == CUBOID_BYTES
    assert np.prod(grid_for_level(method, 3, itemsize).supercuboid) * itemsize == 64 * CUBOID_BYTES  # type: ignore[arg-type]


def test_level_extent_rounds_outward() -> None:
    frame = Box((0, 3, 0), (1001, 1000, 50))
    assert level_extent(frame, 1, "anisotropic") == Box((0, 1, 0), (501, 500, 50))
    assert level_extent(frame, 2, "isotropic") == Box((0, 0, 0), (251, 250, 13))


@pytest.mark.parametrize("ranges", [((5, 5), (0, 1), (0, 1)), ((0, 1), (9, 3), (0, 1)), ((-4, 2), (0, 1), (0, 1))])
def test_empty_inverted_or_negative_ranges_name_the_axis(ranges) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest, match=r"[xyz] range"):
        Box.from_ranges(*ranges)


def test_outside_the_frame_is_out_of_bounds() -> None:
    with pytest.raises(OutOfBounds, match="outside the coordinate frame"):
        check_inside(Box((0, 0, 0), (10, 10, 11)), Box((0, 0, 0), (10, 10, 10)))
