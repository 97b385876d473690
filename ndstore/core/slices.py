"""Slice images for viewers: one plane of a cutout, made displayable and encoded as PNG or JPEG.

Image channels: uint8 as stored; uint16 as a 16-bit PNG (exact) unless a window is given, or the
format is JPEG (8 bits only, full-range window by default); float32 always through a window (0..1
by default). A window `lo,hi` maps lo to 0 and hi to 255, clipping outside. Annotation channels:
each label a colour of its own, the same in every tile (a hash of the id), label 0 transparent.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import imagecodecs
import numpy as np
import numpy.typing as npt
from PIL import Image

from ndstore.core.errors import InvalidRequest

ORIENTATIONS = ("xy", "xz", "yz")
FORMATS = {"png": "image/png", "jpeg": "image/jpeg"}


@dataclass(frozen=True)
class Window:
    lo: float
    hi: float

    @classmethod
    def parse(cls, raw: str) -> Window:
        parts = raw.split(",")
        try:
            lo, hi = (float(p) for p in parts)
        except ValueError:
            raise InvalidRequest(f"window must be two numbers 'lo,hi', not {raw!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
            raise InvalidRequest(f"window {raw!r} must have finite lo < hi")
        return cls(lo, hi)

    def apply(self, plane: npt.NDArray[Any], block_bytes: int = 4 << 20) -> npt.NDArray[np.uint8]:
        """The plane through the window, a block of rows at a time: it holds the plane, its 8-bit
        image and one float32 block (not three float32 copies of the plane)."""
        out: npt.NDArray[np.uint8] = np.empty(plane.shape, np.uint8)
        lo, scale = np.float32(self.lo), np.float32(255.0 / (self.hi - self.lo))
        rows = max(1, block_bytes // (4 * max(1, plane[:1].size)))
        for start in range(0, plane.shape[0], rows):
            block = plane[start:start + rows].astype(np.float32)
            block -= lo
            block *= scale
            np.rint(block, out=block)
            np.clip(block, 0, 255, out=block)
            out[start:start + rows] = block
        return out


def plane_of(data_zyx: npt.NDArray[Any], orientation: str) -> npt.NDArray[Any]:
    """The 2-D image of a one-voxel-thick (z, y, x) cutout, rows down the screen: xy is (y, x),
    xz is (z, x), yz is (z, y)."""
    picks: dict[str, tuple[Any, ...]] = {"xy": (0,), "xz": (slice(None), 0), "yz": (slice(None), slice(None), 0)}
    if orientation in picks:
        plane: npt.NDArray[Any] = data_zyx[picks[orientation]]
        return plane
    raise InvalidRequest(f"orientation must be one of {', '.join(ORIENTATIONS)}, not {orientation!r}")


def label_colours(labels: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """RGBA for a plane of labels: a colour per id from a multiplicative hash, 0 transparent."""
    h = labels.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    rgba = np.empty((*labels.shape, 4), np.uint8)
    for i, shift in enumerate((40, 48, 56)):
        rgba[..., i] = ((h >> np.uint64(shift)) & np.uint64(0xFF)).astype(np.uint8) | np.uint8(0x30)
    rgba[..., 3] = np.where(labels != 0, 255, 0)
    return rgba


def displayable(plane: npt.NDArray[Any], annotation: bool, window: Window | None,
                file_format: str) -> npt.NDArray[Any]:
    """The pixels to encode: 2-D uint8 or uint16 (grey), or (rows, columns, 3|4) uint8 colour."""
    if annotation:
        rgba = label_colours(plane)
        return rgba if file_format == "png" else np.ascontiguousarray(rgba[..., :3])
    kind = plane.dtype
    if window is None and (kind == np.uint8 or (kind == np.uint16 and file_format == "png")):
        return np.ascontiguousarray(plane)
    if window is None:
        window = Window(0, 1) if kind.kind == "f" else Window(0, float(np.iinfo(kind).max))
    return window.apply(plane)


def encode_image(pixels: npt.NDArray[Any], file_format: str, quality: int = 85) -> bytes:
    """PNG through imagecodecs' libpng at zlib level 1 with no row filter; or baseline JPEG through
    Pillow. A viewer waits on the encoder. One byte a pixel (8-bit grey, EM): zlib's run-length
    strategy, on a 512x512 EM plane (benchmarks/bench_viewer.py's data, this 2-core machine) 3 ms
    and 195 KB, against 6-7 ms (180 KB) from Pillow at its fastest settings (level 1, Z_RLE:
    Pillow always tries every row filter) and 11.5 ms with Pillow's defaults at level 1. Wider
    pixels (16-bit grey, the colours of annotation labels) repeat every 2-4 bytes, which run
    lengths (matches one byte back) never see: zlib's default strategy, on a 512x512 label tile,
    ~5 ms and 7-21 KB where the run-length strategy took ~25-30 ms and 170-590 KB
    (docs/design/serving.md, "Encoding the answer")."""
    if file_format == "png":
        one_byte = pixels.ndim == 2 and pixels.dtype.itemsize == 1
        strategy = imagecodecs.PNG.STRATEGY.RLE if one_byte else imagecodecs.PNG.STRATEGY.DEFAULT
        return bytes(imagecodecs.png_encode(pixels, level=1, strategy=strategy, filter=imagecodecs.PNG.FILTER.NONE))
    if file_format == "jpeg":
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=quality)
        return out.getvalue()
    raise InvalidRequest(f"image format must be one of {', '.join(FORMATS)}, not {file_format!r}")
