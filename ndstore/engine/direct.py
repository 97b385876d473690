"""Direct I/O: boxes read from and written to the base tier, bypassing the cache but coherent
with it (the cache tier's `read_base`/`write_base`: a direct write leaves no stale cached copy
readable; a direct read sees every acknowledged write). `RawReads` reads the base tier as it
is, ignoring the cache's dirty data (`?access-mode=raw`)."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.volume import Cutout

Array = npt.NDArray[Any]


class CoherentDirect:
    def __init__(self, cache_tier: CacheTier):
        self.tier = cache_tier

    def read(self, cutout: Cutout) -> Array:
        return self.tier.read_base(cutout, lambda _names: None)[0]

    def write(self, cutout: Cutout, data: Array) -> None:
        self.tier.write_base(cutout, data)


class RawReads:
    def __init__(self, cache_tier: CacheTier):
        self.tier = cache_tier

    def read(self, cutout: Cutout) -> Array:
        return self.tier.read_raw(cutout)

    def write(self, cutout: Cutout, data: Array) -> None:
        self.tier.write_base(cutout, data)
