"""The three-phase ingest pipeline against real HTTP endpoints (moto's S3, SQS and DynamoDB) and
the real base tier: the same handlers and poller as the local runner, the same per-task upload
code as `ndstore ingest`."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

from ndstore.core import morton
from ndstore.core.errors import StorageError
from ndstore.core.geometry import Box
from ndstore.core.tiles import TileRef
from ndstore.engine.ingest import Ingest
from tests.ingest.conftest import BIG_BOX, Pipeline, all_cleaned, make_job, source_volume

pytestmark = pytest.mark.usefixtures("ingest_env")


def test_tiles_become_the_volume_and_all_zero_supercuboids_are_not_stored(ingest_env: str) -> None:
    from ndstore.wiring import services

    ingest = services().ingest
    job = make_job(5, BIG_BOX)
    ingest.create(job)
    pipeline = Pipeline(ingest, job, source_volume(BIG_BOX))
    assert pipeline.upload() == 288
    status = pipeline.run(all_cleaned)
    assert status["tiles"] == {"total": 288, "uploaded": 288, "queued_for_upload": 288}
    assert status["supercuboids"] == {"total": 4, "built": 4, "cleaned": 4}
    assert all(q == {"waiting": 0, "in_flight": 0, "failed": 0} for q in status["queues"].values())
    assert np.array_equal(pipeline.stored(), pipeline.volume)
    assert pipeline.stored_mortons() == sorted(morton.encode_one(*i) for i in [(0, 0, 0), (1, 0, 0), (0, 1, 0)])
    assert pipeline.ingest.tiles.metadata(pipeline.job.tile_key(TileRef(0, 0, 0, 0))) is None  # cleaned up


def test_duplicate_s3_events_count_once_and_change_nothing(pipeline: Pipeline) -> None:
    pipeline.upload()
    events = pipeline.ingest.url(pipeline.ingest.events_queue)
    bodies = [m.body for m in pipeline.ingest.queues.peek(events, 1000) if "ObjectCreated" in m.body]
    assert len(bodies) == 72
    pipeline.ingest.queues.send(events, bodies[:30])  # S3 delivers at least once: thirty twice
    status = pipeline.run(all_cleaned)
    pipeline.ingest.queues.send(events, bodies[30:50])  # and late, after cleanup
    status = pipeline.run(lambda s: sum(q["waiting"] + q["in_flight"] for q in s["queues"].values()) == 0
                          and all_cleaned(s))
    assert status["tiles"]["uploaded"] == 72 and status["supercuboids"]["built"] == 4
    assert np.array_equal(pipeline.stored(), pipeline.volume)


def test_two_last_tiles_landing_together_queue_the_supercuboid_once(pipeline: Pipeline) -> None:
    ingest, job = pipeline.ingest, pipeline.job
    sc = next(job.layout.supercuboids())
    tiles = job.layout.tiles_of(sc)
    for tile in tiles:
        pipeline.put_signed(tile)
    for tile in tiles[:-2]:
        assert ingest.tile_uploaded(job.tile_key(tile)) == "recorded"
    results: list[str] = []
    barrier = threading.Barrier(2)

    def last(tile: TileRef) -> None:
        barrier.wait()
        results.append(Ingest.tile_uploaded(ingest, job.tile_key(tile)))

    threads = [threading.Thread(target=last, args=(t,)) for t in tiles[-2:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("queued") == 1, results
    assert ingest.queues.counts(ingest.url(job.queue("supercuboid"))).total == 1
    assert ingest.tile_uploaded(job.tile_key(tiles[-1])) == "duplicate"  # and a retry queues nothing more
    assert ingest.queues.counts(ingest.url(job.queue("supercuboid"))).total == 1


def test_a_handler_that_fails_on_its_first_try_is_retried(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Ingest.build_supercuboid
    failed: list[str] = []

    def flaky(self: Ingest, body: str) -> None:
        if body not in failed:
            failed.append(body)
            raise StorageError("S3 answered 503 (injected)")
        real(self, body)

    monkeypatch.setattr(Ingest, "build_supercuboid", flaky)
    pipeline.upload()
    status = pipeline.run(all_cleaned)
    assert len(failed) == 4 and status["queues"]["supercuboid"]["failed"] == 0
    assert np.array_equal(pipeline.stored(), pipeline.volume)


def test_a_task_that_keeps_failing_lands_in_the_dead_letter_queue_and_can_be_retried(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Ingest.build_supercuboid
    broken = {"on": True}

    def failing_for_one(self: Ingest, body: str) -> None:
        if broken["on"] and json.loads(body)["index"] == [1, 0, 0]:
            raise StorageError("S3 answered 503 (injected)")
        real(self, body)

    monkeypatch.setattr(Ingest, "build_supercuboid", failing_for_one)
    pipeline.upload()
    status = pipeline.run(lambda s: s["queues"]["supercuboid"]["failed"] == 1 and s["supercuboids"]["cleaned"] == 3)
    assert status["supercuboids"]["built"] == 3
    assert pipeline.stored_mortons() == sorted(morton.encode_one(*i) for i in [(0, 0, 0), (0, 1, 0)])
    broken["on"] = False
    assert pipeline.ingest.retry_failed(pipeline.job) == 1
    pipeline.run(all_cleaned)
    assert np.array_equal(pipeline.stored(), pipeline.volume)


def test_a_missing_tile_is_reported_and_its_supercuboid_never_half_written(pipeline: Pipeline) -> None:
    gone = TileRef(0, 5, 1, 1)  # in supercuboid (0, 0, 0)

    def reader(tile: TileRef) -> Any:
        if tile == gone:
            raise FileNotFoundError(2, "No such file or directory", f"/scope/{tile.z:04d}/1_1.png")
        if tile == TileRef(0, 3, 0, 1):
            return b"\x89PNG\r\n garbage"
        return pipeline.tile_bytes(tile)

    assert pipeline.upload(reader) == 70
    assert sorted(k for k, _ in pipeline.failures) == [pipeline.job.tile_key(TileRef(0, 3, 0, 1)),
                                                       pipeline.job.tile_key(gone)]
    assert any("/scope/0005/1_1.png cannot be read" in e for _, e in pipeline.failures)
    status = pipeline.run(lambda s: s["supercuboids"]["cleaned"] == 3)
    assert status["queues"]["upload"]["failed"] == 2
    assert {f["key"] for f in status["failed_tiles"]} == {k for k, _ in pipeline.failures}
    assert all(f["error"] for f in status["failed_tiles"])
    stored = pipeline.stored()
    assert not stored[:, :512, :512].any()  # (0, 0, 0): nothing of it written
    assert np.array_equal(stored[:, :, 512:], pipeline.volume[:, :, 512:])
    assert np.array_equal(stored[:, 512:], pipeline.volume[:, 512:])
    assert pipeline.stored_mortons() == sorted(morton.encode_one(*i) for i in [(1, 0, 0), (0, 1, 0)])

    assert pipeline.ingest.retry_failed(pipeline.job) == 2  # the lab fixed the files
    assert pipeline.upload() == 2
    pipeline.run(all_cleaned)
    assert np.array_equal(pipeline.stored(), pipeline.volume)


def test_a_partial_supercuboid_keeps_the_voxels_around_it(pipeline: Pipeline) -> None:
    from ndstore.engine.volume import Cutout
    from ndstore.wiring import services
    from tests.ingest.conftest import make_job

    channel = pipeline.channel
    outside = np.full((1, 64, 512, 512), 9, np.uint8)
    services().cache_tier.write(Cutout(channel, 0, Box((0, 0, 0), (512, 512, 64)), range(1)), outside)
    box = Box((0, 0, 0), (256, 256, 8))
    job = make_job(2, box)
    pipeline.ingest.create(job)
    small = Pipeline(pipeline.ingest, job, source_volume(box))
    assert small.upload() == 8
    small.run(all_cleaned)
    got = services().cache_tier.read(Cutout(channel, 0, Box((0, 0, 0), (512, 512, 64)), range(1)))[0]
    assert np.array_equal(got[:8, :256, :256], small.volume)  # the cache saw the ingest: no stale copy
    got[:8, :256, :256] = 9
    assert (got == 9).all()
