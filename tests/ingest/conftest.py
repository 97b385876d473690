"""Ingest fixtures: the pipeline wired to moto's server (S3 with event notifications to SQS, SQS
with dead-letter queues, DynamoDB) and the test Redis, with a bucket, table and queue prefix of
its own per test; an in-process uploader and queue runner that call the same code as
`ndstore ingest` and `lambdas/runner.py`."""

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
from ndstore.engine.ingest import Ingest, IngestJob, fill_manifest
from ndstore.engine.volume import ChannelVolume, Cutout

FRAME = Box((0, 0, 0), (1024, 1024, 80))
BOX = Box((0, 0, 0), (1024, 768, 6))  # 4 x 3 tiles of 256 per slice: 72 tiles in 4 supercuboids
BIG_BOX = Box((0, 0, 0), (1024, 768, 24))  # 288 tiles
TILE = 256


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

    def queue_manifest(self) -> None:
        upload_url = self.ingest.url(self.job.queue("upload"))
        for _ in fill_manifest(self.job, self.ingest.index, self.ingest.queues, upload_url):
            pass

    def upload(self, reader: Callable[[TileRef], bytes] | None = None, limit: int | None = None) -> int:
        """Take upload tasks as an uploader process does (the client's own per-task code) until
        the queue is empty or `limit` tiles went up; returns the tiles uploaded."""
        from ndstore.client.ingest import _upload_one

        reports: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        up = self.ingest.url(self.job.queue("upload"))
        dlq = self.ingest.queues.url(f"{self.job.queue('upload')}-dlq") or ""
        uploaded = 0
        while limit is None or uploaded < limit:
            messages = self.ingest.queues.receive(up, 10, wait_s=0)
            if not messages:
                break
            for m in messages:
                _upload_one(m, self.job, self.ingest.tiles, self.ingest.index, self.ingest.queues, up, dlq,
                            reader or self.tile_bytes, reports)
        while not reports.empty():
            kind, key, value = reports.get()
            uploaded += kind == "uploaded"
            if kind == "failed":
                self.failures.append((key, value))
        return uploaded

    def run(self, until: Callable[[dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
        """Poll the queues with the local runner's poller until `until(status)`."""
        from lambdas.runner import QueuePoller

        poller = QueuePoller(self.ingest.queues, self.ingest.queue_prefix, refresh_s=0.5)
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
        return services().base_tier.read(Cutout(self.channel, 0, box, range(1)))[0]

    def stored_mortons(self) -> list[int]:
        from ndstore.wiring import services

        return services().index.mortons(self.channel.volume_key(0, 0))


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
