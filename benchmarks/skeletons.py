"""Skeletonizing figures for the integrator's benchmarks/bench_segmentation.py: the time and
MB/s per core of `skeleton_fragment` on one supercuboid beside kimimaro alone on the same block
(what the fragment adds: the bounds pass, the shift, the encoding), and of merging a label's
pieces (what a skeleton request costs), on synthetic label blocks at 4x4x40 nm.

    python -m benchmarks.skeletons [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from scipy import ndimage

from ndstore.core.geometry import Box
from ndstore.core.segments import skeleton as sk

NM = (4.0, 4.0, 40.0)


def tubes_block(shape_zyx: tuple[int, int, int], seed: int = 0, dtype: Any = np.uint64) -> np.ndarray:
    """Six slanted tubes (neurites, 60-160 nm in radius) and four blobs (somata-like), in background."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[:shape_zyx[0], :shape_zyx[1], :shape_zyx[2]]
    out = np.zeros(shape_zyx, dtype)
    for i in range(6):
        y0, slope, r, zc = rng.uniform(40, shape_zyx[1] - 40), rng.uniform(-0.3, 0.3), rng.uniform(15, 40), \
            rng.uniform(2, shape_zyx[0] - 2)
        out[(y - (y0 + slope * x)) ** 2 + ((z - zc) * 10) ** 2 < r * r] = np.iinfo(dtype).max - i  # >= 2^63 in uint64
    for i in range(4):
        cy, cx, r = rng.uniform(60, shape_zyx[1] - 60), rng.uniform(60, shape_zyx[2] - 60), rng.uniform(40, 80)
        out[(y - cy) ** 2 + (x - cx) ** 2 + ((z - shape_zyx[0] / 2) * 10) ** 2 < r * r] = 100 + i
    return out


def dense_block(shape_zyx: tuple[int, int, int], labels: int = 200, seed: int = 1,
                dtype: Any = np.uint64) -> np.ndarray:
    """A dense segmentation: every voxel in one of ``labels`` cells (nearest seed at 4x4x40 nm)."""
    rng = np.random.default_rng(seed)
    seeds = np.zeros(shape_zyx, dtype)
    points = tuple(rng.integers(0, s, labels) for s in shape_zyx)
    seeds[points] = np.arange(1, labels + 1, dtype=dtype)
    _, nearest = ndimage.distance_transform_edt(seeds == 0, sampling=NM[::-1], return_indices=True)
    return seeds[tuple(nearest)]


def measure(block: np.ndarray, repeat: int = 1) -> dict[str, float]:
    """Seconds and MB/s (of the block's voxels) on one core: kimimaro alone, skeleton_fragment,
    and merging every label's piece (one fragment) into its skeleton file."""
    box = Box((0, 0, 0), tuple(s - 1 for s in block.shape[::-1]))  # type: ignore[arg-type]  # the block's overlap
    bounds = sk.SkeletonBounds()
    labels = sk.labels_to_skeletonize(block, bounds)
    best: dict[str, float] = {"kimimaro_s": np.inf, "fragment_s": np.inf, "merge_s": np.inf}
    for _ in range(repeat):
        start = time.perf_counter()
        sk.skeletonize(block, labels, NM, bounds.dust_threshold)
        best["kimimaro_s"] = min(best["kimimaro_s"], time.perf_counter() - start)
        start = time.perf_counter()
        blob = sk.skeleton_fragment(block, box, box.hi, NM, bounds)
        best["fragment_s"] = min(best["fragment_s"], time.perf_counter() - start)
        assert blob is not None
        start = time.perf_counter()
        for label in sk.fragment_labels(blob):
            sk.skeleton_of([blob], int(label))
        best["merge_s"] = min(best["merge_s"], time.perf_counter() - start)
    mb = block.nbytes / 1e6
    return {**best, "labels": float(len(labels)), "block_mb": mb, "fragment_bytes": float(len(blob)),
            "kimimaro_mb_s": mb / best["kimimaro_s"], "fragment_mb_s": mb / best["fragment_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shape = (9, 257, 257) if args.quick else (9, 513, 513)  # a uint64 supercuboid and its overlap
    for name, block in (("tubes uint64", tubes_block(shape)), ("dense 200 uint64", dense_block(shape)),
                        ("tubes uint32 x16", tubes_block((17, shape[1], shape[2]), dtype=np.uint32))):
        figures = measure(block, 1 if args.quick else 2)
        print(name, block.shape, " ".join(f"{k}={v:.3g}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
