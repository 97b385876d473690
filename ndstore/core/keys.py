"""The one owner of the key schema of stored supercuboids (see docs/design/key-schema.md).

Object key:   <hash8>&<collection_id>&<experiment_id>&<channel_id>&<res>&<t>&<morton>
Index item:   partition "<collection_id>&<experiment_id>&<channel_id>&<res>&<t>", sort key morton.

The 8-hex-digit hash is the MD5 of the rest of the key: it spreads neighbouring supercuboids
over S3 partitions, and it is computed from the key alone, so no lookup is ever needed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SEPARATOR = "&"
HASH_CHARS = 8


@dataclass(frozen=True, order=True)
class VolumeKey:
    """One (channel, resolution, time sample) volume: the partition of the supercuboid index."""

    collection_id: int
    experiment_id: int
    channel_id: int
    resolution: int
    time: int

    @property
    def partition(self) -> str:
        return SEPARATOR.join(str(v) for v in self._fields())

    @property
    def channel_prefix(self) -> str:
        """`<collection_id>&<experiment_id>&<channel_id>&`: the start of the names of every
        supercuboid of its channel (ChannelVolume.name_prefix)."""
        return SEPARATOR.join(str(v) for v in self._fields()[:3]) + SEPARATOR

    def _fields(self) -> tuple[int, ...]:
        return (self.collection_id, self.experiment_id, self.channel_id, self.resolution, self.time)

    def supercuboid(self, morton: int) -> SupercuboidKey:
        return SupercuboidKey(self, morton)

    @classmethod
    def parse_partition(cls, partition: str) -> VolumeKey:
        parts = partition.split(SEPARATOR)
        if len(parts) != 5:
            raise ValueError(f"not a volume partition key: {partition!r}")
        return cls(*(int(p) for p in parts))


@dataclass(frozen=True, order=True)
class SupercuboidKey:
    volume: VolumeKey
    morton: int

    @property
    def name(self) -> str:
        """`<volume partition>&<morton>`: names the supercuboid's lock and cache entry, the same
        in every process and path, so the cache tier and direct I/O exclude each other."""
        return f"{self.volume.partition}{SEPARATOR}{self.morton}"

    @classmethod
    def from_name(cls, name: str) -> SupercuboidKey:
        partition, _, morton = name.rpartition(SEPARATOR)
        return cls(VolumeKey.parse_partition(partition), int(morton))

    @property
    def object_key(self) -> str:
        return f"{_hash(self.name)}{SEPARATOR}{self.name}"

    @classmethod
    def parse(cls, object_key: str) -> SupercuboidKey:
        parts = object_key.split(SEPARATOR)
        if len(parts) != 7 or not all(p.isascii() and p.isdigit() for p in parts[1:]):
            raise ValueError(f"not a supercuboid object key: {object_key!r}")
        key = cls(VolumeKey(*(int(p) for p in parts[1:6])), int(parts[6]))
        if key.object_key != object_key:
            raise ValueError(f"hash prefix does not match the key: {object_key!r}")
        return key


def _hash(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()[:HASH_CHARS]
