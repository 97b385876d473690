"""The reduce kernels against a plain per-block Python reference."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import numpy as np
import pytest

from ndstore.core.downsample import reduce_mean, reduce_mode


def valid(shape: tuple[int, int, int], inside: tuple[int, int, int]) -> tuple[Any, Any, Any]:
    return tuple(np.arange(n) < m for n, m in zip(shape, inside))  # type: ignore[return-value]


def blocks(shape: tuple[int, int, int], factors: tuple[int, int, int], inside: tuple[int, int, int]) -> Any:
    for bz, by, bx in itertools.product(*(range(n // f) for n, f in zip(shape, factors))):
        cells = [(z, y, x) for z in range(bz * factors[0], (bz + 1) * factors[0])
                 for y in range(by * factors[1], (by + 1) * factors[1])
                 for x in range(bx * factors[2], (bx + 1) * factors[2])
                 if z < inside[0] and y < inside[1] and x < inside[2]]
        yield (bz, by, bx), cells


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
@pytest.mark.parametrize("factors", [(1, 2, 2), (2, 2, 2)])
def test_integer_mean_rounds_half_up_and_never_overflows(dtype: str, factors: tuple[int, int, int]) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    data = rng.integers(info.max - 5, info.max, (4, 6, 6), dtype=dtype, endpoint=True)
    data[0] = rng.integers(0, 4, (6, 6), dtype=dtype)  # small values: the rounding shows
    inside = (4, 5, 5)  # an odd edge in x and y
    got = reduce_mean(data, factors, valid(data.shape, inside))
    for at, cells in blocks(data.shape, factors, inside):
        values = [int(data[c]) for c in cells]
        want = (sum(values) + len(values) // 2) // len(values)
        assert int(got[at]) == want, (at, values)
    assert got.dtype == np.dtype(dtype)


def test_float_mean_stays_float() -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 4, 4) / 3
    got = reduce_mean(data, (1, 2, 2), valid(data.shape, data.shape))
    assert got.dtype == np.float32
    assert np.allclose(got[0], [[data[0, :2, :2].mean(), data[0, :2, 2:].mean()],
                                [data[0, 2:, :2].mean(), data[0, 2:, 2:].mean()]])


@pytest.mark.parametrize("factors", [(1, 2, 2), (2, 2, 2)])
def test_mode_picks_a_present_label_with_the_tie_rule(factors: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(2)
    data = rng.choice(np.array([0, 0, 7, 9, 2**40], np.uint64), (4, 6, 6))
    inside = (3, 6, 5)
    got = reduce_mode(data, factors, valid(data.shape, inside), slab=5)
    for at, cells in blocks(data.shape, factors, inside):
        counts = Counter(int(data[c]) for c in cells)
        if not counts:
            assert got[at] == 0
            continue
        top = max(counts.values())
        tied = [v for v, n in counts.items() if n == top]
        want = min(v for v in tied if v) if any(tied) else 0
        assert int(got[at]) == want, (at, counts)


def test_a_label_is_never_blended() -> None:
    data = np.array([[[5, 6], [7, 8]]], np.uint32)  # four labels, one each
    assert reduce_mode(data, (1, 2, 2), valid(data.shape, data.shape))[0, 0, 0] == 5
    data = np.array([[[0, 0], [3, 3]]], np.uint32)  # a tie between background and a label
    assert reduce_mode(data, (1, 2, 2), valid(data.shape, data.shape))[0, 0, 0] == 3


def test_shapes_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        reduce_mean(np.zeros((1, 3, 4), np.uint8), (1, 2, 2), valid((1, 3, 4), (1, 3, 4)))
