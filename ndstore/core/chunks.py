"""Blosc codec for cuboids, and the base-tier object format of a supercuboid.

A supercuboid object is a small header followed by its cuboids, each blosc-compressed on its
own. The cache tier can then page a supercuboid in by slicing bytes (no recompression), and a
read of part of a supercuboid decompresses only the cuboids it touches. An all-zero cuboid is
stored as a zero-length entry; an all-zero supercuboid is not stored at all.

Each cuboid is a c-blosc 1.x frame (LZ4, level 1, byte shuffle): the frame a Zarr v3 `blosc`
codec reads, so the zarr view sends a stored cuboid as its chunk, byte for byte
(docs/design/standard-views.md, "Store-native chunks"). Cuboids written before were blosc2
frames (format version 3 and up); blosc2 reads both.

Layout (little endian):  b"NDSC" | u8 version | 4s dtype (numpy .str, padded) |
3 x u32 cuboid shape (z, y, x) | 3 x u8 cuboid counts (z, y, x) | N x u32 entry lengths |
the N entries, cuboids in C order of their (z, y, x) position.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import blosc
import blosc2
import numpy as np
import numpy.typing as npt

from ndstore.core.errors import DataCorrupt
from ndstore.core.geometry import XYZ, Box

MAGIC = b"NDSC"
VERSION = 1
_HEADER = struct.Struct("<4sB4s3I3B")

T = TypeVar("T")
R = TypeVar("R")
# How a caller spreads per-cuboid work: builtin map (serial) or a thread pool's map. blosc and
# numpy copies release the GIL, so a pool map uses every core on one supercuboid.
Mapper = Callable[[Callable[[T], R], Iterable[T]], Iterable[R]]

# Cuboids are 256 KiB: blosc2's internal threads cost more than they give at that size (measured
# here: 2 threads are 3-5x slower), and per-call contexts (compress2/decompress2 with cparams)
# are slower still. Parallelism comes from the engine's thread pools, one cuboid per task, which
# only works if blosc2 lets go of the GIL while it (de)compresses: by default it does not.
blosc2.set_nthreads(1)
blosc2.set_releasegil(True)
# The same for python-blosc, which writes the cuboids: one thread also keeps its output the same
# for the same voxels (core/wire.py says why that matters for ETags).
blosc.set_nthreads(1)
blosc.set_releasegil(True)
CUBOID_CODEC = {"cname": "lz4", "clevel": 1, "shuffle": "shuffle"}  # as a Zarr v3 blosc codec names it
BLOSC1_MAX_VERSION = 2  # a frame's first byte: c-blosc 1.x writes 2, blosc2 3 and up


def is_blosc1(blob: bytes | memoryview) -> bool:
    """Whether a stored cuboid is a c-blosc 1.x frame (what a Zarr blosc codec reads)."""
    return len(blob) > 0 and blob[0] <= BLOSC1_MAX_VERSION


def compress_cuboid(cuboid: npt.NDArray[np.generic]) -> bytes:
    """Blosc bytes of one cuboid, or b"" when it is all zeros."""
    data = np.ascontiguousarray(cuboid)
    if not data.any():
        return b""
    return blosc.compress(data, typesize=data.dtype.itemsize, clevel=1,  # type: ignore[no-any-return]
                          shuffle=blosc.SHUFFLE, cname="lz4")


def decompress_cuboid(blob: bytes | memoryview, dtype: np.dtype,
                      shape_zyx: tuple[int, int, int]) -> npt.NDArray[np.generic]:
    if not blob:
        return np.zeros(shape_zyx, dtype)
    out = np.empty(shape_zyx, dtype)
    _decompress_into(blob, out)
    return out


def cuboid_boxes(cuboid: XYZ, counts: XYZ) -> list[Box]:
    """Boxes of the cuboids within a supercuboid (origin 0), numbered in C order of (z, y, x)."""
    return [_box_of(cuboid, (i, j, k)) for k in range(counts[2]) for j in range(counts[1]) for i in range(counts[0])]


def _box_of(cuboid: XYZ, at: XYZ) -> Box:
    lo = (at[0] * cuboid[0], at[1] * cuboid[1], at[2] * cuboid[2])
    return Box(lo, (lo[0] + cuboid[0], lo[1] + cuboid[1], lo[2] + cuboid[2]))


# Reads and writes of the same shapes recur (a viewer's planes, a pipeline's aligned boxes, every
# supercuboid of a large read): their cuboid geometry is computed once per process. A whole
# supercuboid's took ~0.4 ms of Python per call, and a read asked for it twice (serving.md,
# "Work in the request's thread"). Bounded: an entry holds at most a supercuboid's 64 cuboids.
_GEOMETRY_CACHE = 256


@functools.lru_cache(maxsize=_GEOMETRY_CACHE)
def cuboids_touching(region: Box, cuboid: XYZ, counts: XYZ) -> tuple[tuple[int, Box, Box], ...]:
    """(number, cuboid box, part of region in it) of every cuboid ``region`` touches, in
    number order; only the cuboids in the region's index range are visited."""
    first = [max(region.lo[a] // cuboid[a], 0) for a in range(3)]
    last = [min((region.hi[a] - 1) // cuboid[a], counts[a] - 1) for a in range(3)]
    out = []
    for k in range(first[2], last[2] + 1):
        for j in range(first[1], last[1] + 1):
            for i in range(first[0], last[0] + 1):
                box = _box_of(cuboid, (i, j, k))
                part = region.intersect(box)
                if part is not None:
                    out.append(((k * counts[1] + j) * counts[0] + i, box, part))
    return tuple(out)


Slices = tuple[slice, slice, slice]


@functools.lru_cache(maxsize=_GEOMETRY_CACHE)
def _region_decodes(region: Box, cuboid: XYZ, counts: XYZ) -> tuple[tuple[int, bool, Slices, Slices], ...]:
    """Per cuboid ``region`` touches: its number, whether the region covers it whole, where its
    part goes in the region's array and where that part sits in the cuboid's."""
    return tuple((n, part == cbox, part.slices_zyx(region.lo), part.slices_zyx(cbox.lo))
                 for n, cbox, part in cuboids_touching(region, cuboid, counts))


# A cuboid's decode takes ~25 us and its compression ~100 us: handed to a pool one by one, the
# hand-offs (submit, futures, wake-ups) cost more Python time than the work (a fifth of a direct
# read's). A mapper gets the cuboids as this many batches, enough to spread over a big machine.
BATCHES = 16


def in_batches(mapper: Mapper[Any, Any], fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, handed to ``mapper`` as at most BATCHES runs of neighbours."""
    size = -(-len(items) // BATCHES) or 1
    runs = [items[i:i + size] for i in range(0, len(items), size)]
    return [r for done in mapper(lambda run: [fn(x) for x in run], runs) for r in done]


def encode_supercuboid(data: npt.NDArray[np.generic], cuboid: XYZ, counts: XYZ,
                       mapper: Mapper[Any, Any] = map) -> bytes | None:
    """The object bytes of a (z, y, x) supercuboid array, or None when it is all zeros."""
    blobs = in_batches(mapper, lambda b: compress_cuboid(data[b.slices_zyx()]), cuboid_boxes(cuboid, counts))
    return join_supercuboid(blobs, data.dtype, cuboid, counts)


def join_supercuboid(blobs: list[bytes], dtype: np.dtype, cuboid: XYZ, counts: XYZ) -> bytes | None:
    """The object bytes of already compressed cuboid blobs, or None when all are zeros."""
    if not any(blobs):
        return None
    code = np.dtype(dtype).str.encode().ljust(4)
    header = _HEADER.pack(MAGIC, VERSION, code, cuboid[2], cuboid[1], cuboid[0], counts[2], counts[1], counts[0])
    lengths = np.array([len(b) for b in blobs], dtype="<u4").tobytes()
    return b"".join([header, lengths, *blobs])


def split_supercuboid(obj: bytes) -> tuple[np.dtype, XYZ, XYZ, list[memoryview]]:
    """Parse an object into (dtype, cuboid shape xyz, counts xyz, cuboid blobs). The blobs are
    views of ``obj``, not copies: a page-in hands them to Redis as they are (copying every entry
    out of a 14 MiB object was an eighth of a cold read's Python time)."""
    dtype, cuboid, counts, spans = _entries(obj)
    whole = memoryview(obj)
    return dtype, cuboid, counts, [whole[s:e] for s, e in spans]


def _entries(obj: bytes) -> tuple[np.dtype, XYZ, XYZ, list[tuple[int, int]]]:
    """(dtype, cuboid shape xyz, counts xyz, (start, end) of each cuboid's entry in ``obj``)."""
    if len(obj) < _HEADER.size or obj[:4] != MAGIC:
        raise DataCorrupt("not a supercuboid object (bad magic)")
    _, version, dtype, cz, cy, cx, nz, ny, nx = _HEADER.unpack_from(obj)
    if version != VERSION:
        raise DataCorrupt(f"supercuboid object version {version} is not supported")
    n = nz * ny * nx
    lengths = np.frombuffer(obj, dtype="<u4", count=n, offset=_HEADER.size)
    ends = _HEADER.size + 4 * n + np.cumsum(lengths, dtype=np.int64)
    if n == 0 or ends[-1] != len(obj):
        raise DataCorrupt("supercuboid object is truncated or padded")
    starts = np.concatenate(([_HEADER.size + 4 * n], ends[:-1]))
    return np.dtype(dtype.decode().strip()), (cx, cy, cz), (nx, ny, nz), list(zip(starts.tolist(), ends.tolist()))


def decode_supercuboid_region(obj: bytes, region: Box, out: npt.NDArray[np.generic],
                              mapper: Mapper[Any, None] = map) -> None:
    """Write the part ``region`` (coordinates relative to the supercuboid) of the object into
    ``out``, an array of region's shape. Only the cuboids the region touches are decompressed."""
    dtype, cuboid, counts, spans = _entries(obj)
    if dtype != out.dtype:
        raise DataCorrupt(f"stored supercuboid has dtype {dtype}, channel has {out.dtype}")
    whole = memoryview(obj)  # views of the entries: slicing bytes would copy the object once more
    decode_blobs_region({n: whole[a:b] for n, (a, b) in enumerate(spans)}, cuboid, counts, region, out, mapper)


def decode_supercuboid(obj: bytes, mapper: Mapper[Any, None] = map) -> npt.NDArray[np.generic]:
    """The whole supercuboid of an object, (z, y, x), in the dtype its header names."""
    dtype, cuboid, counts, _ = _entries(obj)
    x, y, z = (c * n for c, n in zip(cuboid, counts))
    out = np.empty((z, y, x), dtype)  # every cuboid is decoded into it (an empty one as zeros)
    decode_supercuboid_region(obj, Box((0, 0, 0), (x, y, z)), out, mapper)
    return out


def decode_blobs_region(blobs: dict[int, bytes] | dict[int, memoryview], cuboid: XYZ, counts: XYZ, region: Box,
                        out: npt.NDArray[np.generic], mapper: Mapper[Any, None] = map) -> None:
    """Like decode_supercuboid_region, from cuboid blobs by number (at least those the region
    touches; b"" is an all-zero cuboid)."""
    shape, dtype = (cuboid[2], cuboid[1], cuboid[0]), out.dtype

    def decode(job: tuple[bytes | memoryview, bool, Slices, Slices]) -> None:
        blob, whole, in_out, in_cuboid = job
        target = out[in_out]
        if not blob:
            target[...] = 0
        elif whole and target.flags.c_contiguous:
            _decompress_into(blob, target)
        else:
            scratch = np.empty(shape, dtype)
            _decompress_into(blob, scratch)
            target[...] = scratch[in_cuboid]

    in_batches(mapper, decode, [(blobs[n], whole, in_out, in_cuboid)
                                for n, whole, in_out, in_cuboid in _region_decodes(region, cuboid, counts)])


def _decompress_into(blob: bytes | memoryview, out: npt.NDArray[np.generic]) -> None:
    try:
        nbytes, _, _ = blosc2.get_cbuffer_sizes(blob)
    except Exception as exc:  # noqa: BLE001 - blosc2 raises bare RuntimeError/ValueError on a bad header
        raise DataCorrupt(f"cuboid is not a blosc chunk: {exc}") from None
    if nbytes != out.nbytes:
        raise DataCorrupt(f"cuboid holds {nbytes} bytes, expected {out.nbytes}")
    try:
        if is_blosc1(blob) and out.flags.c_contiguous:
            # c-blosc 1.x reads its own frames in 60-80 us per EM cuboid; blosc2 took 230-260 us
            # for them (and 120-140 for its own format): one-off, 2,000 each
            blosc.decompress_ptr(blob, out.ctypes.data)
        else:
            blosc2.decompress2(blob, dst=out)
    except Exception as exc:  # noqa: BLE001 - whatever blosc says of damaged bytes, they are damaged
        raise DataCorrupt(f"cuboid is corrupt: {exc}") from None

