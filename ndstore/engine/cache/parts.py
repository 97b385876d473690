"""Cuboid blobs: what the cache tier stores of a supercuboid, and the codec work between blobs
and a box (no I/O, no locks).

A supercuboid's hash in the cache holds one blosc blob per cuboid (`b""`: known all zero) and
field META, "dtype cuboid-shape counts", so the flusher needs no metadata database. A base-tier
object is split into the same blobs without recompression (`cuboids_of`); a read decodes the
cuboids a box touches into its output (`decode`); a write compresses the cuboids it covers whole
and merges the ones it covers in part into their old blobs (`merged`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from ndstore.core.chunks import (
    compress_cuboid,
    cuboids_touching,
    decode_blobs_region,
    decompress_cuboid,
    split_supercuboid,
)
from ndstore.core.errors import DataCorrupt, StorageError
from ndstore.core.geometry import Grid, SupercuboidPart
from ndstore.core.parallel import map_ordered
from ndstore.core.plan import PlannedPart
from ndstore.engine.volume import Cutout

Array = npt.NDArray[Any]
Blob = bytes | memoryview  # a cuboid's blosc bytes, or a view of them in a fetched supercuboid object
META = -1  # the cache field holding "dtype cuboid-shape counts"
# A write merges (decodes, overwrites, encodes) up to these many cuboids in the request's thread:
# a 64x64x8 annotation stroke touches at most 2x2x2 cuboids, and under load the codec pool's hop
# cost it more CPU than it saved (serving.md, "Work in the request's thread"). More go to the pool.
SERIAL_MERGE_CUBOIDS = 8


def meta(dtype: np.dtype, grid: Grid) -> bytes:
    return " ".join([dtype.str, *map(str, grid.cuboid), *map(str, grid.cuboids_per_super)]).encode()


def parse_meta(raw: bytes) -> tuple[np.dtype, Grid]:
    dtype, *dims = raw.decode().split()
    v = [int(d) for d in dims]
    return np.dtype(dtype), Grid((v[0], v[1], v[2]), (v[3], v[4], v[5]))


def touching(part: SupercuboidPart, grid: Grid) -> Sequence[Any]:
    """The (number, cuboid box, covered sub-box) of each cuboid of the supercuboid the part touches."""
    return cuboids_touching(part.local_region(grid), grid.cuboid, grid.cuboids_per_super)


def cuboids_of(obj: bytes | None, dtype: np.dtype, count: int) -> Sequence[Blob]:
    """A base-tier object's cuboid blobs (views of it); all ``b""`` (known all-zero) when there is none."""
    if obj is None:
        return [b""] * count
    stored_dtype, _, _, blobs = split_supercuboid(obj)
    if stored_dtype != dtype:
        raise DataCorrupt(f"stored supercuboid has dtype {stored_dtype}, channel has {dtype}")
    return blobs


def untouched(blobs: Sequence[Blob], touched: Sequence[Any]) -> dict[int, Blob]:
    """The blobs of the cuboids a write did not touch (``touched``: its (number, ...) items)."""
    numbers = {number for number, _, _ in touched}
    return {n: b for n, b in enumerate(blobs) if n not in numbers}


def kept(blobs: Sequence[Blob], numbers: Sequence[int]) -> list[Blob]:
    """The blobs of cuboids ``numbers``: views of the fetched object when they are most of it,
    copies when they are a few, so the object is not held for them."""
    views = 2 * len(numbers) > len(blobs)
    return [blobs[n] if views else bytes(blobs[n]) for n in numbers]


def nbytes(blobs: Mapping[str, Mapping[int, bytes]]) -> int:
    return sum(len(b) for found in blobs.values() for b in found.values())


def decode(planned: PlannedPart, blobs: Sequence[Blob | None], numbers: list[int], grid: Grid, out: Array,
           cutout: Cutout, codec: ThreadPoolExecutor | None) -> None:
    """Decode the cuboids ``numbers`` of one planned part into its place in ``out``, on ``codec``
    (None: in the caller's thread)."""
    if any(b is None for b in blobs):
        raise StorageError(f"cuboids of supercuboid {planned.key.name} vanished from the cache; try again")
    decode_blobs_region(dict(zip(numbers, blobs)), grid.cuboid, grid.cuboids_per_super,  # type: ignore[arg-type]
                        planned.part.local_region(grid), out[planned.time_index][planned.part.in_box(cutout.box)],
                        map if codec is None else partial(map_ordered, codec))


def merged(planned: PlannedPart, grid: Grid, src: Array, touched: Sequence[Any], old: Mapping[int, Blob | None],
           codec: ThreadPoolExecutor, whole: Mapping[int, bytes] | None = None) -> dict[int, bytes]:
    """The new blobs of the ``touched`` cuboids of ``src``: whole ones compressed (or taken from
    ``whole``, compressed already), partly covered ones merged into their ``old`` blob."""
    part = planned.part
    shape = (grid.cuboid[2], grid.cuboid[1], grid.cuboid[0])
    local = part.local_region(grid)

    def one(item: tuple[int, Any, Any]) -> tuple[int, bytes]:
        n, cbox, sub = item
        piece = src[sub.slices_zyx(local.lo)]
        if sub == cbox:
            return n, compress_cuboid(piece)
        cuboid = decompress_cuboid(old[n] or b"", src.dtype, shape)  # a fresh array of its own
        cuboid[sub.slices_zyx(cbox.lo)] = piece
        return n, compress_cuboid(cuboid)

    # only the cuboids with work to do go to the pool: a hand-off costs more than a lookup
    done = {n: whole[n] for n, _, _ in touched if n in whole} if whole else {}
    work = [t for t in touched if t[0] not in done]
    return {**done, **dict(map_ordered(codec, one, work, inline_up_to=SERIAL_MERGE_CUBOIDS))}
