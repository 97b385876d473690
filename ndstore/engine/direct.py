"""Direct I/O that stays coherent with the cache tier.

A direct write takes the write locks of the supercuboids it touches, writes back and drops any
cached copy (so no stale copy stays readable), then read-modify-writes the base tier. A direct
read takes read locks and first writes back cached dirty data, so it sees every acknowledged
write. Both use the same lock names as the cache tier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy.typing as npt

from ndstore.engine.cache_tier import CacheTier
from ndstore.engine.volume import Cutout

Array = npt.NDArray[Any]
T = TypeVar("T")


class CoherentDirect:
    def __init__(self, cache_tier: CacheTier):
        self.tier = cache_tier
        self.base = cache_tier.base

    def _names(self, cutout: Cutout) -> list[str]:
        _, jobs = self.base.plan(cutout)
        return sorted({key.name for key, _, _ in jobs})

    def read(self, cutout: Cutout) -> Array:
        return self.read_with(cutout, lambda _names: None)[0]

    def read_with(self, cutout: Cutout, also: Callable[[Sequence[str]], T]) -> tuple[Array, T]:
        """The base-tier read, and ``also(supercuboid names)`` called under the same read locks:
        one snapshot that no writer of those supercuboids can change in between."""
        names = self._names(cutout)
        with self.tier.locks.read(names):
            for name, dirty in zip(names, self.tier.cache.is_dirty(names)):
                if dirty:
                    self.tier.flush_locked(name)
            return self.base.read(cutout), also(names)

    def write(self, cutout: Cutout, data: Array) -> None:
        names = self._names(cutout)
        with self.tier.locks.write(names):
            for name, resident in zip(names, self.tier.cache.resident(names)):
                if resident:
                    self.tier.evict_locked(name)
            self.base.write_locked(cutout, data)
