"""The API suite's cache-tier paths once more, with the supercuboid locks and the cache tier
(NDSTORE_REDIS_URL, NDSTORE_CACHE_REDIS_URL) on a three-node Redis Cluster (tests/conftest.py)
instead of one redis-server. Each test imported below runs twice: in its own module on one node,
and here on the cluster. The NDBlaze buffer stays on its own single redis-server: its appends and
releases are Lua scripts and MULTI blocks over keys of many hash slots (blaze/buffer.py), which
a cluster refuses; it is one node by design (docs/design/blaze.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from redis.cluster import RedisCluster

from ndstore import wiring
from ndstore.storage import redis_client
from tests.api.conftest import Dataset
from tests.api.test_blaze import (  # noqa: F401 - collected here again
    test_blaze_write_is_read_back_through_blaze_and_through_the_cache_after_merge,
    test_deleting_a_channel_drops_its_pending_blaze_writes,
    test_overlapping_blaze_writes_apply_in_sequence_order,
)
from tests.api.test_cutouts import (  # noqa: F401 - every cutout test
    test_box_across_eight_supercuboids,
    test_cache_and_direct_paths_stay_coherent,
    test_default_media_type_is_blosc,
    test_every_access_mode_reads_the_same,
    test_filter_keeps_only_named_ids,
    test_intern_style_blosc_with_bit_width_typesize,
    test_random_writes_and_reads_match_numpy,
    test_time_series_cutouts,
)
from tests.api.test_downsample import test_a_build_runs_to_downsampled_and_the_levels_read_back  # noqa: F401
from tests.api.test_image import (  # noqa: F401
    test_an_unchanged_tile_is_a_304_with_its_etag,
    test_each_orientation_returns_the_stored_plane,
)
from tests.api.test_intern import (  # noqa: F401 - intern over HTTP to a live server, and its fixtures
    boss,
    config,
    test_time_ranges_filters_and_to_black,
    test_uint8_and_uint64_cutouts_read_back_exactly,
)
from tests.api.test_precomputed import (  # noqa: F401
    ng,
    test_compressed_segmentation_chunk_decodes_to_the_labels,
    test_raw_chunk_is_little_endian_x_fastest,
)
from tests.api.test_resources import test_deleting_a_channel_deletes_its_data  # noqa: F401

# test_downsample's module marker does not travel with its test
pytestmark = pytest.mark.usefixtures("ingest_env")


@pytest.fixture(autouse=True)
def _on_redis_cluster(_wired: None, redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After tests/api/conftest.py's wiring: the locks and the cache tier on the cluster, emptied."""
    redis_client.connect(redis_cluster_url).flushdb()  # redis-py sends FLUSHDB to every primary
    monkeypatch.setenv("NDSTORE_REDIS_URL", redis_cluster_url)
    monkeypatch.setenv("NDSTORE_CACHE_REDIS_URL", redis_cluster_url)
    wiring.services.cache_clear()
    yield
    wiring.services.cache_clear()


def test_the_cache_tier_and_locks_really_are_on_the_cluster(admin: Any, dataset: Dataset,
                                                             service_env: dict[str, str]) -> None:
    svc = wiring.services()
    cluster = getattr(svc.cache_tier._cache, "_redis", None)  # the tier's own parts, looked at from outside
    locks = getattr(svc.cache_tier._locks, "_redis", None)
    assert isinstance(cluster, RedisCluster) and isinstance(locks, RedisCluster)
    data = np.random.default_rng(3).integers(1, 255, (20, 700, 1100), dtype=np.uint8)
    url = dataset.cutout("img8", 0, (0, 1100), (0, 700), (0, 20))  # 3 x 2 supercuboids
    assert admin.generic("POST", url, data.tobytes(), content_type="application/octet-stream").status_code == 201
    per_node = [cluster.get_redis_connection(node).dbsize() for node in cluster.get_primaries()]  # type: ignore[no-untyped-call]
    assert len(per_node) == 3 and sum(1 for n in per_node if n) >= 2, per_node  # spread over the nodes
    assert redis.Redis.from_url(service_env["NDSTORE_REDIS_URL"]).dbsize() == 0  # the single node saw nothing
    got = admin.get(url, HTTP_ACCEPT="application/octet-stream")
    assert np.frombuffer(got.content, np.uint8).reshape(data.shape).tobytes() == data.tobytes()
