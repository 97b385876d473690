"""Shard files of `neuroglancer_uint64_sharded_v1` holding whole files by a uint64 key (a
segment's skeleton or mesh), for sharded precomputed products: `shard_file(entries, spec)`
writes one shard from its keys' bytes, `ShardSpec` says where a key goes and declares itself in
an info's "sharding".

Layout (neuroglancer src/datasource/precomputed/sharded.md): the shard index (2^minishard_bits
pairs of uint64 [start, end) of each minishard index, relative to the end of the shard index),
then the minishard indexes (each 3 x n uint64: delta-coded keys, delta-coded offsets, sizes),
then the entries' bytes in minishard then key order. Encodings are raw (a product file is
already compact, and gzip would cost every read). The hash is `identity` (a key's shard is bits
of the key itself, after `preshift_bits`): no hashing for a reader or for us, and consecutive
labels fall in different shards. Cf. ndstore.core.sharded (chunk shards, whose layout the
geometry fixes).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndstore.core.errors import NotFound

UINT64_LIMIT = 1 << 64


@dataclass(frozen=True)
class ShardSpec:
    shard_bits: int
    minishard_bits: int = 0
    preshift_bits: int = 0

    def __post_init__(self) -> None:
        if min(self.shard_bits, self.minishard_bits, self.preshift_bits) < 0 or \
                self.shard_bits + self.minishard_bits > 64 or self.preshift_bits >= 64:
            raise ValueError(f"bad sharding bits: {self}")

    def sharding(self) -> dict[str, Any]:
        """The "sharding" member of a product's info."""
        return {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": self.preshift_bits, "hash": "identity",
                "minishard_bits": self.minishard_bits, "shard_bits": self.shard_bits,
                "minishard_index_encoding": "raw", "data_encoding": "raw"}

    def shard_of(self, key: int) -> int:
        return (key >> self.preshift_bits >> self.minishard_bits) & ((1 << self.shard_bits) - 1)

    def minishard_of(self, key: int) -> int:
        return (key >> self.preshift_bits) & ((1 << self.minishard_bits) - 1)

    def shard_name(self, shard: int) -> str:
        return f"{shard:0{-(-self.shard_bits // 4)}x}.shard"

    def shard_of_name(self, name: str) -> int:
        """The shard a file name (`{hex digits}.shard`, as readers spell it) names; NotFound else."""
        digits = name.removesuffix(".shard")
        try:
            shard = int(digits, 16) if digits.isascii() and digits.isalnum() else -1
        except ValueError:
            shard = -1
        if shard < 0 or shard >= 1 << self.shard_bits or self.shard_name(shard) != name:
            raise NotFound(f"no shard {name!r}: shards are {self.shard_name(0)} .. "
                           f"{self.shard_name((1 << self.shard_bits) - 1)}")
        return shard


def shard_file(entries: Mapping[int, bytes], spec: ShardSpec) -> bytes:
    """One shard file holding ``entries`` (key -> its file's bytes); every key must belong to the
    same shard (ValueError else). An empty mapping makes a shard of empty minishards."""
    shards = {spec.shard_of(key) for key in entries}
    if len(shards) > 1 or any(not 0 <= key < UINT64_LIMIT for key in entries):
        raise ValueError(f"keys of {len(shards)} shards (or outside uint64) given for one shard file")
    minishards: list[list[int]] = [[] for _ in range(1 << spec.minishard_bits)]
    for key in sorted(entries):
        minishards[spec.minishard_of(key)].append(key)
    ordered = [key for keys in minishards for key in keys]
    index_bytes = [24 * len(keys) for keys in minishards]
    data_start = sum(index_bytes)  # relative to the end of the shard index
    shard_index, indexes = [], []
    at, data_at = 0, data_start
    for keys, size in zip(minishards, index_bytes):
        shard_index += [at, at + size]
        at += size
        sizes = np.array([len(entries[key]) for key in keys], "<u8")
        ids = np.array(keys, "<u8")
        offsets = np.zeros(len(keys), "<u8")
        if len(keys):  # each entry follows the last: delta 0 after the first
            offsets[0] = data_at
            data_at += int(sizes.sum())
        deltas = np.diff(ids, prepend=np.uint64(0)).astype("<u8") if len(keys) else ids
        indexes.append(deltas.tobytes() + offsets.tobytes() + sizes.tobytes())
    head = struct.pack(f"<{len(shard_index)}Q", *shard_index)
    return b"".join([head, *indexes, *(entries[key] for key in ordered)])


def minishard_index(ids: list[int], starts: list[int], sizes: list[int]) -> bytes:
    """A raw minishard index of entries in ascending id order: ``starts`` are offsets from the
    end of the shard index; ids and starts are stored delta-coded (a start relative to the end
    of the entry before it)."""
    n = len(ids)
    if n == 0:
        return b""
    id_array = np.array(ids, np.uint64)
    start_array, size_array = np.array(starts, np.uint64), np.array(sizes, np.uint64)
    ends = np.concatenate([np.zeros(1, np.uint64), (start_array + size_array)[:-1]])
    deltas = np.diff(id_array, prepend=np.uint64(0))
    return b"".join(a.astype("<u8").tobytes() for a in (deltas, start_array - ends, size_array))
