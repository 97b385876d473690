"""Tile ingest: the job's description, and the three phases of the pipeline that the lambdas
(or the local runner) call: a tile arrived, build a supercuboid, clean up its tiles.

A task leaves its queue only after the next phase's task is queued (the caller deletes a message
only when its phase returned); every phase can run twice with the same result.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ndstore.core.errors import NotFound, StorageError
from ndstore.core.geometry import Box
from ndstore.core.tiles import SupercuboidRef, TileLayout, TileRef, decode_tile, parse_tile_key, tile_key
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.lambda_triggers import LambdaTriggers
from ndstore.storage.sqs import QueueCounts, SqsQueues
from ndstore.storage.tile_bucket import QUEUE, RECEIPT, S3TileBucket
from ndstore.storage.tile_index import DynamoTileIndex

log = logging.getLogger("ndstore.ingest")
PHASES = ("upload", "supercuboid", "cleanup")


@dataclass(frozen=True)
class IngestJob:
    """Everything a phase needs to know about a job; stored with the job's progress row."""

    job_id: int
    channel: ChannelVolume
    box: tuple[tuple[int, int, int], tuple[int, int, int]]
    tile_x: int
    tile_y: int
    t_start: int
    t_stop: int
    file_format: str
    queue_prefix: str

    @property
    def layout(self) -> TileLayout:
        return TileLayout(Box(*self.box), self.tile_x, self.tile_y, range(self.t_start, self.t_stop),
                          self.channel.grid(0))

    @property
    def name(self) -> str:
        return str(self.job_id)

    def queue(self, phase: str) -> str:
        return f"{self.queue_prefix}-{self.job_id}-{phase}"

    def tile_key(self, tile: TileRef) -> str:
        return tile_key(self.job_id, tile, self.file_format)

    def row(self, sc: SupercuboidRef) -> str:
        return f"{self.job_id}&{sc.t}&{sc.morton}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "channel": self.channel.to_dict()})

    @classmethod
    def from_json(cls, raw: str) -> IngestJob:
        spec = json.loads(raw)
        box = tuple(tuple(v) for v in spec["box"])
        return cls(**{**spec, "channel": ChannelVolume.from_dict(spec["channel"]), "box": box})


def upload_task(job: IngestJob, tile: TileRef) -> str:
    return json.dumps({"job": job.job_id, "tile": [tile.t, tile.z, tile.y_index, tile.x_index],
                       "key": job.tile_key(tile)})


def parse_upload_task(body: str) -> tuple[int, TileRef, str]:
    task = json.loads(body)
    return int(task["job"]), TileRef(*task["tile"]), str(task["key"])


def _supercuboid_task(job: IngestJob, sc: SupercuboidRef) -> str:
    return json.dumps({"job": job.job_id, "t": sc.t, "index": list(sc.index)})


def _parse_supercuboid_task(body: str) -> tuple[int, SupercuboidRef]:
    task = json.loads(body)
    return int(task["job"]), SupercuboidRef(int(task["t"]), tuple(task["index"]))


def fill_manifest(job: IngestJob, index: DynamoTileIndex, queues: SqsQueues, upload_url: str,
                  chunk: int = 200) -> Iterator[int]:
    """Queue an upload task per tile, resuming after the last chunk recorded as sent; yields the
    count sent so far. A crash between sending a chunk and recording it sends that chunk again:
    the uploader skips a tile the index already holds, so no tile is needed twice."""
    total = job.layout.tile_count()
    sent = index.job(job.name)["manifest_sent"]
    tiles = job.layout.manifest()
    for _ in range(sent):
        next(tiles)
    while sent < total:
        batch = [upload_task(job, t) for _, t in zip(range(chunk), tiles)]
        queues.send(upload_url, batch)
        sent += len(batch)
        index.set_manifest_sent(job.name, sent)
        yield sent


class Ingest:
    """The ingest pipeline's state (tile index, queues, tile bucket) and its three phases."""

    def __init__(self, tiles: S3TileBucket, index: DynamoTileIndex, queues: SqsQueues, direct: CoherentDirect,
                 queue_prefix: str, visibility_s: int, max_tries: int,
                 triggers: tuple[LambdaTriggers, dict[str, str]] | None = None):
        """`triggers`: on AWS, the Lambda API and the function of each phase ("supercuboid",
        "cleanup") that a job's queues trigger; None where the local runner polls the queues."""
        self.triggers = triggers
        self.tiles = tiles
        self.index = index
        self.queues = queues
        self.direct = direct
        self.queue_prefix = queue_prefix
        self.visibility_s = visibility_s
        self.max_tries = max_tries
        self._jobs: dict[int, IngestJob] = {}
        self._urls: dict[str, str] = {}
        self._ready = False

    # -- set-up ----------------------------------------------------------------------------------
    @property
    def events_queue(self) -> str:
        return f"{self.queue_prefix}-tile-events"

    def ensure_ready(self, notify_events_queue: bool) -> None:
        """The tile bucket and index; with `notify_events_queue`, the bucket's ObjectCreated
        events go to the events queue (where no S3 -> Lambda trigger exists)."""
        self.index.ensure_ready()
        arn = None
        if notify_events_queue:
            arn = self.queues.arn(self.queues.create(self.events_queue, self.visibility_s, self.max_tries))
        self.tiles.ensure_ready(arn)

    def create(self, job: IngestJob, visibility_s: int | None = None,
               notify_events_queue: bool = True) -> dict[str, str]:
        """Record the job and create its queues (each with a dead-letter queue); idempotent."""
        if not self._ready:
            self.ensure_ready(notify_events_queue)
            self._ready = True
        self.index.put_job(job.name, job.to_json())
        urls = {phase: self.queues.create(job.queue(phase), visibility_s or self.visibility_s, self.max_tries)
                for phase in PHASES}
        if self.triggers:
            api, functions = self.triggers
            for phase, function in functions.items():
                api.attach(self.queues.arn(urls[phase]), function)
        return urls

    def job(self, job_id: int) -> IngestJob:
        if job_id not in self._jobs:
            raw = self.index.job_spec(str(job_id))
            if raw is None:
                raise NotFound(f"no ingest job {job_id} in the tile index")
            self._jobs[job_id] = IngestJob.from_json(raw)
        return self._jobs[job_id]

    def url(self, queue: str) -> str:
        if queue not in self._urls:
            url = self.queues.url(queue)
            if url is None:
                raise NotFound(f"queue {queue} does not exist (the job was completed or cancelled)")
            self._urls[queue] = url
        return self._urls[queue]

    # -- phase 1: a tile arrived -----------------------------------------------------------------
    def tile_uploaded(self, key: str) -> str:
        """Record the tile, delete its upload task, queue its supercuboid's task when it was the
        last tile missing. Returns what happened (for logs and tests)."""
        try:
            job_id, tile = parse_tile_key(key)
            job = self.job(job_id)
        except (ValueError, NotFound) as exc:  # not a tile, or its job was completed or cancelled
            log.warning("ignoring %s: %s", key, exc)
            return "ignored"
        metadata = self.tiles.metadata(key)
        if metadata is None:
            return "gone"  # cleaned up already: a late duplicate event
        layout = job.layout
        sc = layout.supercuboid_of(tile)
        row = job.row(sc)
        new = self.index.record_tile(job.name, row, layout.ordinal(tile), layout.tile_count_of(sc))
        if metadata.get(RECEIPT) and metadata.get(QUEUE):
            try:
                self.queues.delete_message(metadata[QUEUE], metadata[RECEIPT])
            except StorageError:
                log.info("upload task of %s was deleted already or its receipt expired", key)
        state = self.index.supercuboid(row)
        if state["queued"] or len(state["tiles"]) < state["expected"]:
            return "recorded" if new else "duplicate"
        if not self.index.claim(row, key):
            return "duplicate"  # another tile's handler queues it
        self.queues.send(self.url(job.queue("supercuboid")), [_supercuboid_task(job, sc)])
        self.index.mark(row, "queued")
        return "queued"

    # -- phase 2: build a supercuboid ------------------------------------------------------------
    def build_supercuboid(self, body: str) -> None:
        """Pack the supercuboid's tiles into the base tier (through the cache tier's locks, so
        no cached copy goes stale), then queue its cleanup."""
        job_id, sc = _parse_supercuboid_task(body)
        job = self.job(job_id)
        layout = job.layout
        region = layout.region_of(sc)
        state = self.index.supercuboid(job.row(sc))
        if not state["cleaned"]:  # a rerun after cleanup must not read tiles that are gone
            tiles = layout.tiles_of(sc)
            blobs = self.tiles.get_many([job.tile_key(t) for t in tiles])
            missing = [str(t) for t, b in zip(tiles, blobs) if b is None]
            if missing:
                raise StorageError(f"supercuboid {sc.index} t={sc.t} of job {job_id}: tiles missing: "
                                   f"{', '.join(missing[:5])}")
            data = np.zeros((1, *region.shape_zyx), job.channel.dtype)
            for tile, blob in zip(tiles, blobs):
                box = layout.tile_box(tile)
                pixels = decode_tile(blob or b"", f"tile {job.tile_key(tile)}", (job.tile_y, job.tile_x),
                                     (box.hi[1] - box.lo[1], box.hi[0] - box.lo[0]), job.channel.dtype)
                data[(0, *box.slices_zyx(region.lo))] = pixels[None]
            self.direct.write(Cutout(job.channel, 0, region, range(sc.t, sc.t + 1)), data)
            self.index.mark_counted(job.name, job.row(sc), "built", "supercuboids_built")
        self.queues.send(self.url(job.queue("cleanup")), [_supercuboid_task(job, sc)])

    # -- phase 3: clean up -----------------------------------------------------------------------
    def cleanup(self, body: str) -> None:
        job_id, sc = _parse_supercuboid_task(body)
        job = self.job(job_id)
        self.tiles.delete_many([job.tile_key(t) for t in job.layout.tiles_of(sc)])
        self.index.mark_counted(job.name, job.row(sc), "cleaned", "supercuboids_cleaned", drop_tiles=True)

    # -- the job as a whole ----------------------------------------------------------------------
    def status(self, job: IngestJob) -> dict[str, Any]:
        layout = job.layout
        counters = self.index.job(job.name)
        queues: dict[str, dict[str, int]] = {}
        failed_tiles: list[dict[str, str]] = []
        for phase in PHASES:
            url, dlq = self.queues.url(job.queue(phase)), self.queues.url(f"{job.queue(phase)}-dlq")
            counts = self.queues.counts(url) if url else QueueCounts(0, 0)
            dead = self.queues.counts(dlq) if dlq else QueueCounts(0, 0)
            queues[phase] = {"waiting": counts.waiting, "in_flight": counts.in_flight, "failed": dead.total}
            if phase == "upload" and dlq and dead.total:
                failed_tiles = [_failed(m.json()) for m in self.queues.peek(dlq, 50)]
        return {
            "tiles": {"total": layout.tile_count(), "uploaded": counters["tiles_uploaded"],
                      "queued_for_upload": counters["manifest_sent"]},
            "supercuboids": {"total": layout.supercuboid_count(), "built": counters["supercuboids_built"],
                             "cleaned": counters["supercuboids_cleaned"]},
            "queues": queues,
            "failed_tiles": failed_tiles,
        }

    def retry_failed(self, job: IngestJob) -> int:
        """Move every dead-letter task of the job back to its queue."""
        moved = 0
        for phase in PHASES:
            url, dlq = self.queues.url(job.queue(phase)), self.queues.url(f"{job.queue(phase)}-dlq")
            if url and dlq:
                moved += self.queues.move_all(dlq, url)
        return moved

    def remove(self, job: IngestJob, delete_tiles: bool) -> None:
        """Delete the job's queues and index rows (and, when cancelled, its tiles)."""
        layout = job.layout
        if delete_tiles:
            keys = [job.tile_key(t) for t in layout.manifest()]
            self.tiles.delete_many(keys)
        for phase in PHASES:
            url = self.queues.url(job.queue(phase))
            if self.triggers and url and phase in self.triggers[1]:
                self.triggers[0].detach(self.queues.arn(url))
            self.queues.delete(job.queue(phase))
            self._urls.pop(job.queue(phase), None)
        self.index.delete([job.row(sc) for sc in layout.supercuboids()] + [job.name])
        self._jobs.pop(job.job_id, None)


def _failed(task: dict[str, Any]) -> dict[str, str]:
    return {"key": str(task.get("key", "")), "error": str(task.get("error", "failed after repeated tries"))}


def failed_upload_task(body: str, error: str) -> str:
    """An upload task as the client sends it to the dead-letter queue: with what went wrong."""
    return json.dumps({**json.loads(body), "error": error})

