"""The cache tier and its locks on a three-node Redis Cluster: hash tags keep each supercuboid's
keys on one node, and everything behaves as on one node. (The cuboid cache's and the locks'
contract suites run on a Cluster too: tests/contracts.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ndstore.core.geometry import Box
from ndstore.engine.cache.daemons import CacheManager
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import make_cutout
from tests.engine.conftest import make_cache_tier, small_channel

CHANNEL = small_channel("uint16", cid=31)


def test_cache_tier_on_redis_cluster(tmp_path: Path, redis_cluster_url: str) -> None:
    tier: CacheTier = make_cache_tier(tmp_path, redis_cluster_url)
    extent = CHANNEL.extent(0)
    reference = np.zeros(extent.shape_zyx, np.uint16)
    rng = np.random.default_rng(2)
    for i in range(5):
        lo = [int(rng.integers(0, s // 2)) for s in extent.hi]
        box = Box(tuple(lo), tuple(min(s, a + 600) for a, s in zip(lo, extent.hi)))  # type: ignore[arg-type]
        data = rng.integers(1, 60000, box.shape_zyx, dtype=np.uint16)
        (tier if i % 2 else CoherentDirect(tier)).write(make_cutout(CHANNEL, 0, box, range(1), 1 << 32),
                                                        data[np.newaxis])
        reference[box.slices_zyx()] = data
    whole = make_cutout(CHANNEL, 0, extent, range(1), 1 << 32)
    np.testing.assert_array_equal(tier.read(whole)[0], reference)
    assert tier._cache.used_memory() > 0
    CacheManager(tier.upkeep, high_bytes=0, low_bytes=0).run_once()  # evict (and write back) everything
    assert tier._cache.count() == (0, 0)
    np.testing.assert_array_equal(tier._base.read(whole)[0], reference)
