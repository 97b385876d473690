"""Synthetic volumes for the demo dataset, tests and benchmarks.

`em_like` mimics electron-microscopy imagery closely enough for compression figures to mean
something: textured cell interiors (noise over a smooth field, which lz4 barely compresses)
crossed by flat dark membranes, tuned so blosc lz4+shuffle keeps about 85-90% of the bytes,
as it does on real EM data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def _smooth_field(shape: tuple[int, int, int], rng: np.random.Generator, cell: int) -> npt.NDArray[np.float32]:
    coarse = rng.random(tuple(max(2, -(-s // cell) + 1) for s in shape), dtype=np.float32)
    for axis, size in enumerate(shape):
        coarse = np.repeat(coarse, cell, axis=axis).take(np.arange(size), axis=axis)
    return coarse


def em_like(shape_zyx: tuple[int, int, int], seed: int = 0) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    field = _smooth_field(shape_zyx, rng, 16)
    image = 90 + 100 * field + rng.normal(0, 14, shape_zyx).astype(np.float32)
    image[field < 0.17] = 24  # membranes and dark organelles: flat, compressible runs
    return np.clip(image, 0, 255).astype(np.uint8)


def sparse_labels(shape_zyx: tuple[int, int, int], seed: int = 0, n: int = 12,
                  dtype: Any = np.uint64) -> npt.NDArray[Any]:
    """A mostly-zero label volume with ``n`` axis-aligned objects carrying large ids."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(shape_zyx, dtype)
    for i in range(n):
        size = [max(1, s // int(rng.integers(4, 9))) for s in shape_zyx]
        lo = [int(rng.integers(0, s - d + 1)) for s, d in zip(shape_zyx, size)]
        labels[tuple(slice(a, a + d) for a, d in zip(lo, size))] = (1 << 40) + i + 1
    return labels
