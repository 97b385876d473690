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
