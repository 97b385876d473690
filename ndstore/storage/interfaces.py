"""The storage protocols every backend implements, and that the engine depends on."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from ndstore.core.keys import SupercuboidKey, VolumeKey


class ObjectStore(Protocol):
    """A flat key -> bytes store: the base tier (S3 or a local directory)."""

    def ensure_ready(self) -> None:
        """Create the bucket/directory if it is missing."""

    def get_many(self, keys: Sequence[str]) -> Iterator[tuple[str, bytes | None]]:
        """Fetch keys in parallel; yield (key, bytes) as each arrives, None for a missing key."""

    def put_many(self, items: Mapping[str, bytes]) -> None: ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete keys; missing keys are not an error."""


class SupercuboidIndex(Protocol):
    """Which supercuboids are stored: one entry per object, by volume and Morton code."""

    def ensure_ready(self) -> None: ...

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None: ...

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None: ...

    def mortons(self, volume: VolumeKey) -> list[int]:
        """Morton codes of the stored supercuboids of one volume, ascending."""


class ExclusiveLocks(Protocol):
    """Named exclusive locks with a lease, shared by every process that writes the base tier."""

    def hold(self, names: Sequence[str]) -> AbstractContextManager[None]:
        """Hold every lock in ``names`` for the duration of the ``with`` block.
        Raises LockTimeout if they cannot all be taken in time."""


class RWLocks(ExclusiveLocks, Protocol):
    """Named readers-writer locks; `hold` is the write (exclusive) mode."""

    def read(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]: ...

    def write(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]: ...

    def mixed(self, reads: Sequence[str] = (), writes: Sequence[str] = (),
              timeout_s: float | None = None) -> AbstractContextManager[None]:
        """Read locks on some names and write locks on others, held together."""


class CuboidCache(Protocol):
    """Cuboid blobs of resident supercuboids by name, with an LRU index and a dirty set.
    Callers hold the supercuboid's lock; the cache only stores."""

    def resident(self, names: Sequence[str]) -> list[bool]: ...

    def get_many(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None]]: ...

    def get_if_resident(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None] | None]: ...

    def get_all(self, name: str, count: int) -> list[bytes | None]: ...

    def put(self, name: str, blobs: Mapping[int, bytes], now: float, dirty: bool) -> None: ...

    def touch(self, names: Sequence[str], now: float) -> None: ...

    def dirty_before(self, when: float, limit: int) -> list[str]: ...

    def is_dirty(self, names: Sequence[str]) -> list[bool]: ...

    def clear_dirty(self, name: str) -> None: ...

    def evict(self, name: str) -> None: ...

    def names_with_prefix(self, prefix: str) -> list[str]: ...

    def coldest(self, count: int) -> list[str]: ...

    def used_memory(self) -> int: ...

    def count(self) -> tuple[int, int]: ...
