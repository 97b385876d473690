"""Sharded precomputed (`neuroglancer_uint64_sharded_v1`) computed from a level's geometry, so a
shard file can be served live, and a byte range of it costs only the chunks it covers.

Layout (docs/design/standard-views.md): chunks are the level's cuboids (as in the unsharded
view). A chunk's id is the compressed Morton code of its grid position; hash `identity`,
`minishard_bits` 0 and `preshift_bits` p: shard s holds the chunk ids [s << p, (s + 1) << p),
i.e. a Morton range of cuboids. A shard file is its index (one minishard: 16 bytes), the
minishard index (3 x n uint64: delta-coded ids, offsets, sizes) and the chunks in id order.
Raw chunks have sizes known from the geometry, so a raw shard holds up to 32 MiB of voxels and
its indexes cost no read; compressed_segmentation sizes depend on the voxels, so such a shard is
encoded whole when read and holds at most MAX_ENCODED_SHARD_VOXEL_BYTES of voxels.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndstore.core.errors import NotFound
from ndstore.core.geometry import Box, level_extent
from ndstore.core.precomputed import RAW, PrecomputedVolume
from ndstore.core.segments.shards import minishard_index

MAX_SHARD_VOXEL_BYTES = 32 << 20
MAX_ENCODED_SHARD_VOXEL_BYTES = 2 << 20  # 8 cuboids: every ranged read of such a shard encodes them all
SHARD_INDEX_BYTES = 16  # one minishard: [start, end) of its index


@dataclass(frozen=True)
class LevelShards:
    extent: Box
    chunk: tuple[int, int, int]  # x, y, z voxels
    grid: tuple[int, int, int]  # chunks per axis, x y z
    bits: tuple[int, int, int]  # Morton bits per axis
    preshift_bits: int
    shard_bits: int
    itemsize: int

    def sharding(self) -> dict[str, Any]:
        return {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": self.preshift_bits, "hash": "identity",
                "minishard_bits": 0, "shard_bits": self.shard_bits, "minishard_index_encoding": "raw",
                "data_encoding": "raw"}

    def shard_name(self, shard: int) -> str:
        return f"{shard:0{-(-self.shard_bits // 4)}x}.shard"

    def shard_of_name(self, name: str) -> int:
        digits = name.removesuffix(".shard")
        shard = int(digits, 16)
        if self.shard_name(shard) != name or shard >= 1 << self.shard_bits:
            raise NotFound(f"no shard {name!r} at this scale: shards are {self.shard_name(0)} .. "
                           f"{self.shard_name((1 << self.shard_bits) - 1)}")
        return shard

    def position(self, chunk_id: int) -> tuple[int, int, int] | None:
        """The grid position of a compressed Morton code; None where it falls outside the grid."""
        pos, j = [0, 0, 0], 0
        for i in range(max(self.bits)):
            for axis in range(3):
                if i < self.bits[axis]:
                    pos[axis] |= (chunk_id >> j & 1) << i
                    j += 1
        x, y, z = pos
        if x < self.grid[0] and y < self.grid[1] and z < self.grid[2]:
            return x, y, z
        return None

    def chunk_box(self, position: tuple[int, int, int]) -> Box:
        lo = tuple(a + p * c for a, p, c in zip(self.extent.lo, position, self.chunk))
        hi = tuple(min(v + c, b) for v, c, b in zip(lo, self.chunk, self.extent.hi))
        return Box(lo, hi)  # type: ignore[arg-type]

    def chunks(self, shard: int) -> list[tuple[int, Box]]:
        """(id, box) of every chunk of the shard, in id order."""
        first = shard << self.preshift_bits
        out = []
        for chunk_id in range(first, first + (1 << self.preshift_bits)):
            position = self.position(chunk_id)
            if position is not None:
                out.append((chunk_id, self.chunk_box(position)))
        return out


def level_shards(volume: PrecomputedVolume, level: int, encoding: str = RAW) -> LevelShards:
    extent = level_extent(volume.frame, level, volume.method)
    chunk = volume.grid(level).cuboid
    grid = tuple(-(-(b - a) // c) for a, b, c in zip(extent.lo, extent.hi, chunk))
    bits = tuple(max(0, (g - 1).bit_length()) for g in grid)
    total = sum(bits)
    chunk_bytes = chunk[0] * chunk[1] * chunk[2] * volume.dtype.itemsize
    limit = MAX_SHARD_VOXEL_BYTES if encoding == RAW else MAX_ENCODED_SHARD_VOXEL_BYTES
    preshift = min(total, max(0, (limit // chunk_bytes).bit_length() - 1))
    return LevelShards(extent, chunk, grid, bits, preshift, total - preshift, volume.dtype.itemsize)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Piece:
    """A part of a shard file: bytes known up front, or a chunk to read."""

    start: int
    size: int
    header: bytes | None = None
    box: Box | None = None


def shard_layout(shards: LevelShards, shard: int, sizes: list[int] | None = None) -> list[Piece]:
    """The shard's indexes (one piece) and its chunks; `sizes` are the encoded chunks' sizes, raw
    voxels when not given."""
    chunks = shards.chunks(shard)
    if sizes is None:
        sizes = [box.nvoxels * shards.itemsize for _, box in chunks]
    index_bytes = 24 * len(chunks)
    starts = (index_bytes + np.cumsum([0, *sizes[:-1]], dtype=np.int64)).tolist() if chunks else []
    minishard = minishard_index([chunk_id for chunk_id, _ in chunks], starts, sizes)
    head = struct.pack("<QQ", 0, index_bytes) + minishard
    pieces = [Piece(0, len(head), header=head)]
    at = len(head)
    for (_, box), size in zip(chunks, sizes):
        pieces.append(Piece(at, size, box=box))
        at += size
    return pieces


def overlapping(pieces: list[Piece], first: int, last: int) -> Iterator[tuple[Piece, int, int]]:
    """(piece, its first byte, its last byte + 1) of every piece that bytes first..last (inclusive) touch."""
    for piece in pieces:
        lo, hi = max(first, piece.start), min(last + 1, piece.start + piece.size)
        if lo < hi:
            yield piece, lo - piece.start, hi - piece.start
