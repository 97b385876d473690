"""Ingest fixtures: the pipeline wired to moto's server (S3 with event notifications to SQS, SQS
with dead-letter queues, DynamoDB) and the test Redis, with a bucket, table and queue prefix of
its own per test; an in-process uploader and queue runner that call the same code as
`ndstore ingest` (its per-batch upload, over presigned PUTs) and `lambdas/runner.py`."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ndstore.core.geometry import Box
from ndstore.core.synthetic import em_like
from ndstore.core.tiles import TileRef, encode_tile
from ndstore.engine.dataplane import Read
from ndstore.engine.ingest import Ingest, IngestJob, Lease, TileUpload
from ndstore.engine.volume import ChannelVolume, Cutout

FRAME = Box((0, 0, 0), (1024, 1024, 80))
BOX = Box((0, 0, 0), (1024, 768, 6))  # 4 x 3 tiles of 256 per slice: 72 tiles in 4 supercuboids
BIG_BOX = Box((0, 0, 0), (1024, 768, 24))  # 288 tiles
TILE = 256
UPLOADER = "service"  # the name the engine calls leases and uploads by (a user's pk through the API)


def source_volume(box: Box = BOX) -> npt.NDArray[np.uint8]:
    """EM-like voxels, with the supercuboid at x 512:1024, y 512:768 all zero (never stored)."""
    vol = em_like(box.shape_zyx, seed=3)
    vol[:, 512:768, 512:1024] = 0
    return vol


@dataclass
class Pipeline:
    ingest: Ingest
    job: IngestJob
    volume: npt.NDArray[np.uint8]
    failures: list[tuple[str, str]] = field(default_factory=list)
    _encoded: dict[TileRef, bytes] = field(default_factory=dict)

    @property
    def channel(self) -> ChannelVolume:
        return self.job.channel

    def tile_bytes(self, tile: TileRef) -> bytes:
        if tile not in self._encoded:
            box = self.job.layout.tile_box(tile)
            self._encoded[tile] = encode_tile(self.volume[box.slices_zyx()][0], self.job.file_format)
        return self._encoded[tile]

    def put_signed(self, tile: TileRef, body: bytes | None = None, receipt: str = "no-task") -> str:
        return put_signed(self.ingest, self.job, tile, self.tile_bytes(tile) if body is None else body, receipt)

    def upload(self, reader: Callable[[TileRef], bytes] | None = None, limit: int | None = None) -> int:
        """Lease upload tasks and upload their tiles as an uploader process of `ndstore ingest`
        does (its own per-batch code, through the engine calls its routes make) until no task is
        left or `limit` tiles went up; returns the tiles uploaded."""
        import requests

        from ndstore.client.ingest import JobShape, _upload_batch

        job, box = self.job, self.job.layout.box
        shape = JobShape(job.job_id, ((box.lo[0], box.hi[0]), (box.lo[1], box.hi[1])), job.tile_x, job.tile_y)
        reports: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        uploaded = 0
        with requests.Session() as store:
            while limit is None or uploaded < limit:
                leases = self.ingest.lease(job, 10, UPLOADER)
                if not leases:
                    break
                tasks = [{"tile": [le.tile.t, le.tile.z, le.tile.y_index, le.tile.x_index], "receipt": le.receipt}
                         for le in leases]
                _upload_batch(EngineRoutes(self), store, shape, tasks, reader or self.tile_bytes, reports)
                while not reports.empty():
                    kind, _, _ = reports.get()
                    uploaded += kind == "uploaded"
        return uploaded

    def run(self, until: Callable[[dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
        """Poll the queues with the local runner's poller until `until(status)`."""
        from lambdas.runner import QueuePoller

        # a failed record is tried again after 1 s, not after 2, 4, 8 s (the runner's backoff, capped)
        poller = QueuePoller(self.ingest.queues, self.ingest.queue_prefix, refresh_s=0.5, retry_cap_s=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not poller.poll_once():
                status = self.ingest.status(self.job)
                if until(status):
                    return status
                time.sleep(0.2)
        raise AssertionError(f"the pipeline did not get there in {timeout}s: {self.ingest.status(self.job)}")

    def stored(self) -> npt.NDArray[Any]:
        from ndstore.wiring import services

        box = self.job.layout.box
        return services().plane.read(Cutout(self.channel, 0, box, range(1)), Read.RAW)[0]  # type: ignore[no-any-return]

    def stored_mortons(self) -> list[int]:
        from ndstore.wiring import services

        return services().index.mortons(self.channel.volume_key(0, 0))


def put_signed(ingest: Ingest, job: IngestJob, tile: TileRef, body: bytes, receipt: str = "no-task") -> str:
    """Put a tile into the bucket as a presigned PUT the service granted would; returns its key."""
    return ingest.put_tile(job, tile, body, receipt)


class EngineRoutes:
    """What the upload client's routes call, without HTTP (tests/api/test_ingest.py covers those)."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.timeout_s = 30.0

    def uploads(self, job_id: int, tiles: list[dict[str, Any]]) -> list[dict[str, Any]]:
        targets = self.pipeline.ingest.grant_uploads(
            self.pipeline.job, [TileUpload(TileRef(*t["tile"]), t["receipt"], t["sha256"], t["size"]) for t in tiles],
            UPLOADER)
        return [{"url": t.url, "headers": t.headers} for t in targets]

    def report_failed(self, job_id: int, tasks: list[dict[str, Any]]) -> int:
        job = self.pipeline.job
        self.pipeline.failures += [(job.tile_key(TileRef(*t["tile"])), t["error"]) for t in tasks]
        return self.pipeline.ingest.report_failed(job, [(Lease(TileRef(*t["tile"]), t["receipt"]), t["error"])
                                                        for t in tasks], UPLOADER)


def all_cleaned(status: dict[str, Any]) -> bool:
    sc = status["supercuboids"]
    return bool(sc["cleaned"] == sc["total"])


def make_job(job_id: int = 1, box: Box = BOX, file_format: str = "png", prefix: str = "") -> IngestJob:
    from ndstore.wiring import services

    channel = ChannelVolume(1, 1, 7, np.dtype("uint8"), FRAME, 3, "anisotropic", 1)
    return IngestJob(job_id, channel, (box.lo, box.hi), TILE, TILE, 0, 1, file_format,
                     prefix or services().ingest.queue_prefix)


@pytest.fixture
def pipeline(ingest_env: str) -> Pipeline:
    from ndstore.wiring import services

    ingest = services().ingest
    job = make_job()
    ingest.create(job)
    return Pipeline(ingest, job, source_volume())
