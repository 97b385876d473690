"""A read over a long time series costs round trips per batch of supercuboids, not per sample,
and holds no lock longer than its batch's I/O (issue 21: one voxel over 20,000 samples took
190 s and kept a writer waiting 28 s)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from ndstore.core.geometry import Box
from ndstore.engine.cache import tier as tier_module
from ndstore.engine.cache.lock_free import SNAPSHOT_CUBOIDS
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.volume import ChannelVolume, make_cutout

# The tier's batch (READ_BATCH, 256 in the service) and its lock client's names per script call
# (rwlock.BATCH, 256), made smaller here: the same cuts and calls at an eighth of the supercuboids;
# more samples than a lock-free snapshot takes, so the hot read is batched under locks too
READ_BATCH = 32
LOCKS_PER_CALL = 10
SAMPLES = 2 * READ_BATCH + 9
assert SAMPLES > SNAPSHOT_CUBOIDS


def channel() -> ChannelVolume:
    probe = ChannelVolume(1, 1, 7, np.dtype("uint16"), Box((0, 0, 0), (1, 1, 1)), 1, "anisotropic", 1)
    sc = probe.grid(0).supercuboid
    return ChannelVolume(1, 1, 7, np.dtype("uint16"), Box((0, 0, 0), sc), 1, "anisotropic", SAMPLES)


def test_one_voxel_over_many_samples_is_read_in_batches(cache_tier: CacheTier,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_module, "READ_BATCH", READ_BATCH)
    chan = channel()
    voxel = Box((5, 6, 7), (6, 7, 8))
    series = np.arange(1, SAMPLES + 1, dtype=np.uint16).reshape(SAMPLES, 1, 1, 1)
    cache_tier.write(make_cutout(chan, 0, voxel, range(SAMPLES), 1 << 30), series)
    cache_tier.upkeep.flush_all()
    for name in list(cache_tier.coldest(10 * SAMPLES)):
        cache_tier.evict(name, 5)  # the read below pages every sample in

    held_together: list[int] = []
    calls = {"acquire": 0, "release": 0}
    locks = cache_tier._locks  # the tier's own lock client, spied on
    real_mixed, real_call = locks.mixed, locks._call  # type: ignore[attr-defined]
    monkeypatch.setattr(locks, "_batch", LOCKS_PER_CALL)

    @contextmanager
    def mixed(reads: Sequence[str] = (), writes: Sequence[str] = (), timeout_s: float | None = None) -> Iterator[None]:
        held_together.append(len(set(reads) | set(writes)))
        with real_mixed(reads=reads, writes=writes, timeout_s=timeout_s):
            yield

    def call(script: str, names: list[str], *args: Any) -> Any:
        if script in calls:
            calls[script] += 1
        return real_call(script, names, *args)

    monkeypatch.setattr(locks, "mixed", mixed)
    monkeypatch.setattr(locks, "_call", call)
    for attempt in ("cold", "hot"):
        held_together.clear()
        calls.update(acquire=0, release=0)
        got = cache_tier.read(make_cutout(chan, 0, voxel, range(SAMPLES), 1 << 30))
        np.testing.assert_array_equal(got, series)
        batches = -(-SAMPLES // READ_BATCH)
        assert len(held_together) == batches and max(held_together) <= READ_BATCH, (attempt, held_together)
        # a batch's locks are taken and given back in a call or two each (LOCKS_PER_CALL per call)
        assert calls["acquire"] <= 2 * batches * -(-READ_BATCH // LOCKS_PER_CALL), (attempt, calls)
        assert calls["release"] <= batches * -(-READ_BATCH // LOCKS_PER_CALL), (attempt, calls)
