import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ndstore.core import morton

coord = st.integers(0, morton.MAX_COORD)


@given(coord, coord, coord)
def test_round_trip(x: int, y: int, z: int) -> None:
    code = morton.encode(x, y, z)
    assert [int(v) for v in morton.decode(code)] == [x, y, z]


@given(st.lists(st.tuples(coord, coord, coord), min_size=1, max_size=50))
def test_vectorised_matches_scalar(points: list[tuple[int, int, int]]) -> None:
    xs, ys, zs = (np.array(a) for a in zip(*points))
    codes = morton.encode(xs, ys, zs)
    assert [int(c) for c in codes] == [morton.encode_one(*p) for p in points]


def test_bit_interleaving_and_order() -> None:
    assert [morton.encode_one(*p) for p in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (2, 0, 0)]] == [1, 2, 4, 7, 8]
    top = morton.MAX_COORD
    assert morton.encode_one(top, top, top) == (1 << 63) - 1


@pytest.mark.parametrize("bad", [-1, morton.MAX_COORD + 1])
def test_out_of_range_coordinates_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="must lie in"):
        morton.encode(bad, 0, 0)
    with pytest.raises(ValueError, match="must lie in"):
        morton.encode_one(0, 0, bad)
