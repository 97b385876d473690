"""Building the resolution hierarchy through the SQS path (the local runner's poller calling the
Lambda handler, moto's SQS/DynamoDB) and the Spark path (local mode), each level compared with a
numpy reference reduction of the level below; sparse regions stay unstored; a failing task is
retried; cached copies of a rebuilt level are not served stale."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ndstore.core import morton
from ndstore.core.geometry import Box
from ndstore.core.synthetic import em_like
from ndstore.engine.downsample import DownsampleJob, Downsampler, DownsampleRuns, factors
from ndstore.engine.levels import StoredLevels
from ndstore.engine.volume import ChannelVolume, Cutout

pytestmark = pytest.mark.usefixtures("ingest_env")


def channel(dtype: str, method: str, frame: tuple[int, int, int], levels: int = 3, cid: int = 1,
            annotation: bool = False) -> ChannelVolume:
    return ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), frame), levels, method,  # type: ignore[arg-type]
                         1, annotation=annotation)


def write_level0(chan: ChannelVolume, data: npt.NDArray[Any]) -> None:
    from ndstore.wiring import services

    services().cache_tier.write(Cutout(chan, 0, chan.extent(0), range(1)), data[None])  # dirty in the cache


def read_level(chan: ChannelVolume, level: int) -> npt.NDArray[Any]:
    from ndstore.wiring import services

    return services().cache_tier.read(Cutout(chan, level, chan.extent(level), range(1)))[0]


def reference(chan: ChannelVolume, data: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """One level up, written plainly: pad to whole blocks, count the voxels inside, mean with
    rounding half up (float math is exact at these sizes), or for labels the per-label count with
    the tie rule (a label beats 0, then the smallest)."""
    fz, fy, fx = factors(chan)
    pads = [(0, -n % f) for n, f in zip(data.shape, (fz, fy, fx))]
    padded = np.pad(data, pads)
    inside = np.pad(np.ones(data.shape, bool), pads)
    z, y, x = (n // f for n, f in zip(padded.shape, (fz, fy, fx)))

    def block_sum(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return a.reshape(z, fz, y, fy, x, fx).sum(axis=(1, 3, 5))  # type: ignore[no-any-return]

    counts = block_sum(inside.astype(np.int64))
    if not chan.annotation:
        sums = block_sum(padded.astype(np.float64))
        return np.floor(sums / np.maximum(counts, 1) + 0.5).astype(data.dtype)  # type: ignore[no-any-return]
    labels = sorted(int(v) for v in np.unique(data))
    best = np.zeros((z, y, x), data.dtype)
    best_score = np.full((z, y, x), -1)
    for label in labels[::-1]:  # the smallest label last: it wins ties among labels
        score = block_sum(((padded == label) & inside).astype(np.int64)) * 2 + (label != 0)
        take = score >= best_score
        best = np.where(take, np.array(label, data.dtype), best)
        best_score = np.where(take, score, best_score)
    return best


def run_sqs(chan: ChannelVolume, job_id: int, timeout: float = 180) -> dict[str, Any]:
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    runs: DownsampleRuns = services().downsample_runs
    job = DownsampleJob(job_id, chan, runs.queue_prefix)
    runs.start(job)
    poller = QueuePoller(runs.queues, runs.queue_prefix, refresh_s=0.5, retry_cap_s=1)  # retried after 1 s, not 2, 4, 8
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not poller.poll_once():
            status = runs.status(job)
            if status["state"] != "IN_PROGRESS":
                return status
            time.sleep(0.2)
    raise AssertionError(f"no end in {timeout}s: {runs.status(job)}")


def stored(chan: ChannelVolume, level: int) -> list[tuple[int, int, int]]:
    from ndstore.wiring import services

    return sorted(morton.decode_one(m) for m in services().index.mortons(chan.volume_key(level, 0)))


def check_levels(chan: ChannelVolume, data: npt.NDArray[Any]) -> None:
    level_data = data
    for level in range(1, chan.num_levels):
        level_data = reference(chan, level_data)
        got = read_level(chan, level)
        assert got.shape == level_data.shape
        assert np.array_equal(got, level_data), f"level {level} differs"


def test_images_anisotropic_through_sqs_equal_the_reference_and_sparse_stays_sparse() -> None:
    chan = channel("uint8", "anisotropic", (1100, 600, 20))  # odd edges in x, y; z stays 20
    data = em_like((20, 600, 1100), seed=4)
    data[:, :, 1024:] = 0  # the supercuboids past x 1024 hold nothing: never stored
    write_level0(chan, data)
    status = run_sqs(chan, 1)
    assert status["state"] == "DOWNSAMPLED"
    assert status["levels"] == {"1": {"total": 1, "done": 1, "failed": 0}, "2": {"total": 1, "done": 1, "failed": 0}}
    assert stored(chan, 0) == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert stored(chan, 1) == [(0, 0, 0)] and stored(chan, 2) == [(0, 0, 0)]
    check_levels(chan, data)
    # the task that finished the run marked every level, wherever it ran (no API polled the run)
    from ndstore.wiring import services

    assert StoredLevels(services().objects).built(chan) == [0, 1, 2]


def test_annotations_isotropic_through_sqs_take_the_mode() -> None:
    chan = channel("uint64", "isotropic", (200, 150, 130), annotation=True, cid=2)  # 128^3 supercuboids
    rng = np.random.default_rng(5)
    data = rng.choice(np.array([0, 0, 0, 17, 17, 2**40 + 3, 99], np.uint64), (130, 150, 200))
    data[:, :, 128:] = 0
    write_level0(chan, data)
    status = run_sqs(chan, 2)
    assert status["state"] == "DOWNSAMPLED", status
    check_levels(chan, data)
    assert set(np.unique(read_level(chan, 1))) <= {0, 17, 2**40 + 3, 99}  # never a blend


def test_a_failing_task_is_retried_and_one_that_keeps_failing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.core.errors import StorageError

    chan = channel("uint16", "anisotropic", (1024, 512, 8), levels=2, cid=3)
    data = em_like((8, 512, 1024), seed=6).astype(np.uint16) * 200
    write_level0(chan, data)
    real = Downsampler.build_parent
    calls: list[Any] = []

    def flaky(self: Downsampler, volume: ChannelVolume, parent: Any) -> None:
        calls.append(parent)
        if len(calls) == 1:
            raise StorageError("S3 answered 503 (injected)")
        real(self, volume, parent)

    monkeypatch.setattr(Downsampler, "build_parent", flaky)
    status = run_sqs(chan, 3)
    assert status["state"] == "DOWNSAMPLED" and len(calls) == 2
    check_levels(chan, data)

    def broken(self: Downsampler, volume: ChannelVolume, parent: Any) -> None:
        raise StorageError("S3 answered 503 (injected, every time)")

    monkeypatch.setattr(Downsampler, "build_parent", broken)
    status = run_sqs(chan, 4)
    assert status["state"] == "FAILED" and status["levels"]["1"] == {"total": 1, "done": 0, "failed": 1}


def test_a_rebuild_is_idempotent_and_replaces_cached_copies() -> None:
    chan = channel("uint8", "anisotropic", (512, 512, 4), levels=2, cid=4)
    data = em_like((4, 512, 512), seed=7)
    write_level0(chan, data)
    assert run_sqs(chan, 5)["state"] == "DOWNSAMPLED"
    first = read_level(chan, 1)  # level 1 now resident in the cache
    assert run_sqs(chan, 6)["state"] == "DOWNSAMPLED"
    assert np.array_equal(read_level(chan, 1), first)
    data[:, :256, :256] = 255
    write_level0(chan, data)
    assert run_sqs(chan, 7)["state"] == "DOWNSAMPLED"
    check_levels(chan, data)  # the cached level-1 copy was evicted, not served


def test_the_spark_path_builds_the_same_levels(spark: Any) -> None:
    from ndstore.engine.spark_downsample import build_hierarchy
    from ndstore.wiring import downsampler_for, services

    img = channel("uint16", "isotropic", (300, 256, 140), cid=5)  # 128^3 supercuboids for uint16 isotropic
    img_data = (em_like((140, 256, 300), seed=8).astype(np.uint16) * 250)
    ann = channel("uint32", "anisotropic", (1100, 520, 20), cid=6, annotation=True)
    ann_data = np.random.default_rng(9).choice(np.array([0, 0, 4, 4, 8], np.uint32), (20, 520, 1100))
    for chan, data in ((img, img_data), (ann, ann_data)):
        write_level0(chan, data)
        seen: list[int] = []
        result = build_hierarchy(spark, chan, services().downsampler, partial(downsampler_for, services().config),
                                 on_level=lambda level, _info, seen=seen: seen.append(level))
        assert result["state"] == "DOWNSAMPLED", result
        assert seen == [1, 2]
        check_levels(chan, data)
        assert json.dumps(result)  # the CLI prints it
