"""Deleting a channel deletes everything it ever stored, at every level and time sample, whatever
its experiment declares now; lowering num_time_samples or num_hierarchy_levels hides data and
deletes none. On both the file store with the SQLite index and S3 with DynamoDB (moto).

On main a purge walked the levels and time samples declared at the time of the delete: data
written at t=3 or level 4 of an experiment later lowered to 1 time sample and 2 levels stayed in
the object store and the index for good."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from rest_framework.test import APIClient

from tests.api.conftest import Dataset, make_dataset

OCTET = "application/octet-stream"
BACKENDS = {"s3+dynamodb": {}, "file+sqlite": {"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}}
LOWERED = {"num_time_samples": 1, "num_hierarchy_levels": 2}
DECLARED = {"num_time_samples": 4, "num_hierarchy_levels": 5}


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    from ndstore import wiring

    for name, value in BACKENDS[request.param].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NDSTORE_DATA_DIR", str(tmp_path))
    wiring.services.cache_clear()
    yield request.param
    wiring.services.cache_clear()


def channel_prefix(collection: str, channel: str) -> str:
    from ndstore.api.lookups import channel_volume
    from ndstore.api.models import Channel

    return channel_volume(Channel.objects.get(name=channel, experiment__collection__name=collection)).name_prefix


def leftovers(prefix: str) -> dict[str, list[str]]:
    """Everything of the channel whose supercuboid names start with `prefix` that any tier still
    holds: objects, index entries (every volume, declared or not), cached supercuboids (their
    keys and their places in the LRU index and dirty set), pending NDBlaze writes. Empty: gone
    (locks on its names aside while their leases run out)."""
    from ndstore.core.keys import SupercuboidKey
    from ndstore.wiring import services

    svc = services()
    objects = [k for k in svc.objects.list_keys()
               if k.count("&") == 6 and SupercuboidKey.parse(k).name.startswith(prefix)]
    cache = redis.Redis.from_url(svc.config.cache_redis_url or svc.config.redis_url)
    # a lock's bookkeeping (ndrw:{name}:*) outlives a purge by at most its lease: every key of it
    # expires; one with no expiry would stay for good, and counts
    cached = [k.decode() for k in cache.scan_iter(match=f"*{prefix}*")
              if not (k.startswith(b"ndrw:") and cache.pttl(k) > 0)]
    cached += [f"{z}:{n.decode()}" for z in ("ndc:index", "ndc:dirty")
               for n, _ in cache.zscan_iter(z, match=f"{prefix}*")]
    return {"objects": objects, "index": [v.partition for v in svc.index.index.volumes(prefix)], "cache": cached,
            "blaze": svc.blaze_buffer.pending_names(prefix)}


def write_everywhere(admin: APIClient, ds: Dataset, ch: str) -> dict[str, np.ndarray]:
    """A write in every tier at levels and time samples past LOWERED: the base tier at t=3 and at
    level 4, the cache tier (written back) at level 2, t=1, the cache tier (dirty) at level 3, t=2,
    NDBlaze (pending) at level 1, t=3. Returns the base-tier writes by URL."""
    from ndstore.wiring import services

    rng = np.random.default_rng(9)
    base = {ds.cutout(ch, 0, (0, 64), (0, 64), (0, 8), t=(3, 4), direct=True): rng.integers(1, 255, (1, 8, 64, 64)),
            ds.cutout(ch, 4, (0, 16), (0, 16), (0, 8), t=(0, 1), direct=True): rng.integers(1, 255, (1, 8, 16, 16))}
    for url, data in base.items():
        assert admin.post(url, data.astype(np.uint8).tobytes(), content_type=OCTET).status_code == 201
    block = np.full((1, 8, 16, 16), 7, np.uint8).tobytes()
    assert admin.post(ds.cutout(ch, 2, (0, 16), (0, 16), (0, 8), t=(1, 2)), block,
                      content_type=OCTET).status_code == 201
    assert services().cache_tier.upkeep.flush_all() >= 1
    assert admin.post(ds.cutout(ch, 3, (0, 16), (0, 16), (0, 8), t=(2, 3)), block,
                      content_type=OCTET).status_code == 201
    blaze = ds.cutout(ch, 1, (0, 16), (0, 16), (0, 8), t=(3, 4)).replace("/v1/cutout/", "/v1/blaze/cutout/")
    assert admin.post(blaze, block, content_type=OCTET).status_code == 201
    return {url: data.astype(np.uint8) for url, data in base.items()}


def test_a_channel_delete_purges_levels_and_times_its_experiment_no_longer_declares(
        admin: APIClient, backend: str) -> None:
    ds = make_dataset(admin, "purge", frame=(600, 600, 32), levels=5, times=4, channels={"img8": "uint8"})
    base = write_everywhere(admin, ds, "img8")
    prefix = channel_prefix("purge", "img8")
    held = leftovers(prefix)
    assert len(held["objects"]) == 3 and len(held["index"]) == 3 and held["cache"] and held["blaze"], held

    experiment = "/v1/collection/purge/experiment/e1/"
    assert admin.put(experiment, LOWERED, format="json").status_code == 200
    hidden = admin.get(next(iter(base)).replace("/direct", ""), HTTP_ACCEPT=OCTET)
    assert hidden.status_code == 400 and "time range 3:4" in hidden.json()["message"]
    assert leftovers(prefix) == held  # lowering deletes nothing ...
    assert admin.put(experiment, DECLARED, format="json").status_code == 200
    for url, data in base.items():  # ... and raising again serves it as it was
        r = admin.get(url, HTTP_ACCEPT=OCTET)
        assert r.status_code == 200 and r.content == data.tobytes(), url

    assert admin.put(experiment, LOWERED, format="json").status_code == 200
    assert admin.delete("/v1/collection/purge/experiment/e1/channel/img8/").status_code == 204
    assert leftovers(prefix) == {"objects": [], "index": [], "cache": [], "blaze": []}
