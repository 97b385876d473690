"""`?window=` costs about the plane's 8-bit image, not three float32 copies of the plane (13x the
plane for uint8, before): numpy reports its buffers to tracemalloc, so the peak is measured."""

import tracemalloc

import numpy as np

from ndstore.core.slices import Window


def test_a_window_over_a_large_plane_holds_its_image_and_one_block() -> None:
    plane = np.random.default_rng(0).integers(0, 255, (4096, 4096), dtype=np.uint8)  # 16 MiB
    tracemalloc.start()
    try:
        image = Window(10, 200).apply(plane)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert image.dtype == np.uint8 and image.shape == plane.shape
    assert peak < plane.nbytes + 2 * (4 << 20) + (1 << 20), peak  # the image, two float32 blocks, a little
