"""Tile ingest: the job's description, the upload work the service hands out, and the three
phases of the pipeline that the lambdas (or the local runner) call: a tile arrived, build a
supercuboid, clean up its tiles.

A task leaves its queue only after the next phase's task is queued (the caller deletes a message
only when its phase returned); every phase can run twice with the same result.

The server alone decides what a job writes where (DESIGN §9). Uploaders hold no credentials for
the queues, the tile index or the bucket: through the service they lease upload tasks of their
own job and get, per tile, a presigned PUT that carries the service's signature of the tile's
key, content digest and task. A job's target (channel, box, dtype, tile size) is read from a
record the service sealed with its secret; a handler ignores a record or a tile it cannot verify,
and builds a supercuboid only from tiles whose bytes are the ones their uploader was given leave
to send (docs/design/ingest.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ndstore.core.errors import InvalidRequest, NotFound, StorageError
from ndstore.core.geometry import Box
from ndstore.core.signing import BadSignature, Signer
from ndstore.core.tiles import SupercuboidRef, TileLayout, TileRef, decode_tile, parse_tile_key, tile_key
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import (
    ExclusiveLocks,
    JobState,
    QueueCounts,
    TileStore,
    Triggers,
    UploadTarget,
    WorkQueue,
)

log = logging.getLogger("ndstore.ingest")
PHASES = ("upload", "supercuboid", "cleanup")
# A tile's metadata (x-amz-meta-* in S3): its upload task's receipt, the SHA-256 of the content its
# uploader was given leave to send, and the service's signature of (key, SHA-256, receipt).
RECEIPT, SHA256, SIGNATURE = "upload-receipt", "upload-sha256", "upload-signature"
MANIFEST_CHUNK = 500  # upload tasks queued per lease while the manifest is not all queued
MAX_LEASE = 100
UPLOAD_URL_S = 3600
_SHA256 = re.compile(r"\A[0-9a-f]{64}\Z")


class Refused(InvalidRequest):
    """A tile or task the pipeline will not ingest: not its job's, not signed, not as signed."""


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


def tile_ref(value: Any) -> TileRef:
    """A tile as a client or a queue message names it: [t, z, y, x], non-negative integers."""
    if not (isinstance(value, list) and len(value) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 for v in value)):
        raise InvalidRequest(f"a tile is [t, z, y index, x index] of non-negative integers, not {value!r}"[:200])
    return TileRef(*value)


def parse_upload_task(body: str) -> tuple[int, TileRef, str]:
    task = json.loads(body)
    return int(task["job"]), tile_ref(task["tile"]), str(task["key"])


def _supercuboid_task(job: IngestJob, sc: SupercuboidRef) -> str:
    return json.dumps({"job": job.job_id, "t": sc.t, "index": list(sc.index)})


def _parse_supercuboid_task(body: str) -> tuple[int, SupercuboidRef]:
    task = json.loads(body)
    index = task["index"]
    if not (isinstance(index, list) and len(index) == 3 and all(isinstance(i, int) for i in index)):
        raise Refused(f"a supercuboid task names no supercuboid: {body[:200]}")
    return int(task["job"]), SupercuboidRef(int(task["t"]), (index[0], index[1], index[2]))


@dataclass(frozen=True)
class Lease:
    """An upload task given to the job's uploader: the tile, and the receipt that deletes it."""

    tile: TileRef
    receipt: str


@dataclass(frozen=True)
class TileUpload:
    """What an uploader sends once it has read a leased tile: its content's SHA-256."""

    tile: TileRef
    receipt: str
    sha256: str


def tile_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class Ingest:
    """The ingest pipeline's state (tile index, queues, tile bucket) and its three phases."""

    def __init__(self, tiles: TileStore, index: JobState, queues: WorkQueue, direct: CoherentDirect,
                 queue_prefix: str, visibility_s: int, max_tries: int, signer: Signer, locks: ExclusiveLocks,
                 triggers: tuple[Triggers, dict[str, str]] | None = None):
        """`signer`: the service's key for what uploaders and the tile index must not be able to
        forge. `locks`: leases every web node shares (one queues a job's next manifest chunk at a
        time). `triggers`: on AWS, the Lambda API and the function of each phase ("supercuboid",
        "cleanup") that a job's queues trigger; None where the local runner polls the queues."""
        self.signer = signer
        self.locks = locks
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
        self.index.put_job(job.name, self.signer.seal(job.name, job.to_json()))
        urls = {phase: self.queues.create(job.queue(phase), visibility_s or self.visibility_s, self.max_tries)
                for phase in PHASES}
        if self.triggers:
            api, functions = self.triggers
            for phase, function in functions.items():
                api.attach(self.queues.arn(urls[phase]), function)
        return urls

    def job(self, job_id: int) -> IngestJob:
        """The job as the service recorded it; BadSignature for a record it did not seal."""
        if job_id not in self._jobs:
            sealed = self.index.job_spec(str(job_id))
            if sealed is None:
                raise NotFound(f"no ingest job {job_id} in the tile index")
            job = IngestJob.from_json(self.signer.open(str(job_id), sealed))
            if job.job_id != job_id or job.queue_prefix != self.queue_prefix:
                raise BadSignature(f"the record of ingest job {job_id} describes another job")
            self._jobs[job_id] = job
        return self._jobs[job_id]

    def url(self, queue: str) -> str:
        if queue not in self._urls:
            url = self.queues.url(queue)
            if url is None:
                raise NotFound(f"queue {queue} does not exist (the job was completed or cancelled)")
            self._urls[queue] = url
        return self._urls[queue]

    # -- upload work, handed out by the service --------------------------------------------------
    def lease(self, job: IngestJob, count: int) -> list[Lease]:
        """Up to `count` upload tasks of the job for its uploader, hidden from other uploaders
        for the queue's visibility timeout. While the manifest is not all queued, the next chunk
        is queued first, by one caller at a time (one that dies between queueing a chunk and
        recording it leaves that chunk to be queued again: its tiles' tasks then come twice, and
        the second upload of a tile is recorded as a duplicate). Tasks whose tile the index holds
        already are deleted, not handed out."""
        self._queue_manifest_chunk(job)
        upload_url = self.url(job.queue("upload"))
        leases: list[Lease] = []
        for message in self.queues.receive(upload_url, min(count, MAX_LEASE), wait_s=1):
            try:
                _, tile, _ = parse_upload_task(message.body)
                ordinal = job.layout.ordinal(tile)
            except (ValueError, KeyError, TypeError, InvalidRequest) as exc:  # not a task this service queued
                log.warning("dropping a task that is no tile of job %d from its upload queue: %s", job.job_id, exc)
                self.queues.delete_message(upload_url, message.receipt)
                continue
            if self.index.has_tile(job.row(job.layout.supercuboid_of(tile)), ordinal):
                self.queues.delete_message(upload_url, message.receipt)
            else:
                leases.append(Lease(tile, message.receipt))
        return leases

    def upload_progress(self, job: IngestJob) -> dict[str, Any]:
        """How far the upload is: tasks queued of the manifest, waiting and leased (approximate,
        as SQS counts); `done` when all were queued and none is left."""
        total, queued = job.layout.tile_count(), self.index.job(job.name)["manifest_sent"]
        counts = self.queues.counts(self.url(job.queue("upload")))
        return {"total": total, "queued": queued, "waiting": counts.waiting, "leased": counts.in_flight,
                "done": queued >= total and counts.total == 0}

    def _queue_manifest_chunk(self, job: IngestJob) -> None:
        total = job.layout.tile_count()
        if self.index.job(job.name)["manifest_sent"] >= total:
            return
        with self.locks.hold([f"ingest-manifest&{job.job_id}"]):
            sent = self.index.job(job.name)["manifest_sent"]  # another caller may have queued it meanwhile
            if sent >= total:
                return
            tiles = job.layout.manifest()
            for _ in range(sent):
                next(tiles)
            batch = [upload_task(job, t) for _, t in zip(range(MANIFEST_CHUNK), tiles)]
            self.queues.send(self.url(job.queue("upload")), batch)
            self.index.advance_manifest(job.name, sent, sent + len(batch))

    def grant_uploads(self, job: IngestJob, uploads: Sequence[TileUpload]) -> list[UploadTarget]:
        """A presigned PUT per tile, for its key in the job's prefix only, whose metadata carries
        the service's signature of (key, content SHA-256, task receipt). A tile outside the job's
        manifest is refused."""
        targets = []
        for upload in uploads:
            job.layout.ordinal(upload.tile)  # InvalidRequest for a tile that is not the job's
            if not _SHA256.match(upload.sha256):
                raise InvalidRequest(f"sha256 of tile {upload.tile} must be 64 lowercase hex digits")
            if not 0 < len(upload.receipt) <= 2048:
                raise InvalidRequest(f"the receipt of tile {upload.tile} is missing or too long")
            key = job.tile_key(upload.tile)
            targets.append(self.tiles.upload_target(key, self._leave(key, upload.sha256, upload.receipt), UPLOAD_URL_S))
        return targets

    def put_tile(self, job: IngestJob, tile: TileRef, body: bytes, receipt: str) -> str:
        """Store a tile the service received itself, as a PUT it granted would; returns its key."""
        job.layout.ordinal(tile)
        key = job.tile_key(tile)
        self.tiles.put(key, body, self._leave(key, tile_digest(body), receipt))
        return key

    def _leave(self, key: str, sha256: str, receipt: str) -> dict[str, str]:
        """The metadata that gives a tile leave to be ingested: the service's signature of it."""
        return {RECEIPT: receipt, SHA256: sha256, SIGNATURE: self.signer.sign(key, sha256, receipt)}

    def report_failed(self, job: IngestJob, failures: Sequence[tuple[Lease, str]]) -> int:
        """Tiles the uploader could not read or that failed its checks: to the dead-letter queue
        with the reason (listed by status, requeued by retry_failed), their tasks deleted."""
        upload_url, dlq = self.url(job.queue("upload")), self.url(f"{job.queue('upload')}-dlq")
        for lease, error in failures:
            job.layout.ordinal(lease.tile)
            self.queues.send(dlq, [failed_upload_task(upload_task(job, lease.tile), error[:1000])])
            self.queues.delete_message(upload_url, lease.receipt)
        return len(failures)

    def _verify(self, key: str, metadata: dict[str, str], body: bytes | None = None) -> None:
        """The tile is one the service gave leave to upload, and (given its bytes) unchanged."""
        sha, receipt, signature = (metadata.get(k, "") for k in (SHA256, RECEIPT, SIGNATURE))
        if not signature or not self.signer.verify(signature, key, sha, receipt):
            raise Refused(f"tile {key} does not carry the service's signature: it was not uploaded with leave "
                          "from this service (or its metadata was changed)")
        if body is not None and tile_digest(body) != sha:
            raise Refused(f"tile {key} is not the content its uploader was given leave to send (SHA-256 differs)")

    # -- phase 1: a tile arrived -----------------------------------------------------------------
    def tile_uploaded(self, key: str) -> str:
        """Record the tile, delete its upload task, queue its supercuboid's task when it was the
        last tile missing. Returns what happened (for logs and tests)."""
        try:
            job_id, tile = parse_tile_key(key)
            job = self.job(job_id)
            if key != job.tile_key(tile):
                raise Refused(f"{key} is not the key of tile {tile} of job {job_id}")
            job.layout.ordinal(tile)  # InvalidRequest: not a tile of the job's manifest
        except (ValueError, NotFound, BadSignature, InvalidRequest) as exc:  # not a tile of a job we know
            log.warning("ignoring %s: %s", key, exc)
            return "ignored"
        metadata = self.tiles.metadata(key)
        if metadata is None:
            return "gone"  # cleaned up already: a late duplicate event
        try:
            self._verify(key, metadata)
        except Refused as exc:
            log.warning("refusing %s: %s", key, exc)
            return "refused"
        layout = job.layout
        sc = layout.supercuboid_of(tile)
        row = job.row(sc)
        new = self.index.record_tile(job.name, row, layout.ordinal(tile), layout.tile_count_of(sc))
        try:
            self.queues.delete_message(self.url(job.queue("upload")), metadata[RECEIPT])
        except (StorageError, NotFound):
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
        region = layout.region_of(sc)  # InvalidRequest for a supercuboid the job does not write
        state = self.index.supercuboid(job.row(sc))
        if not state["cleaned"]:  # a rerun after cleanup must not read tiles that are gone
            tiles = layout.tiles_of(sc)
            blobs = self.tiles.get_many_with_metadata([job.tile_key(t) for t in tiles])
            missing = [str(t) for t, b in zip(tiles, blobs) if b is None]
            if missing:
                raise StorageError(f"supercuboid {sc.index} t={sc.t} of job {job_id}: tiles missing: "
                                   f"{', '.join(missing[:5])}")
            data = np.zeros((1, *region.shape_zyx), job.channel.dtype)
            for tile, found in zip(tiles, blobs):
                blob, metadata = found or (b"", {})
                self._verify(job.tile_key(tile), metadata, blob)
                box = layout.tile_box(tile)
                pixels = decode_tile(blob, f"tile {job.tile_key(tile)}", (job.tile_y, job.tile_x),
                                     (box.hi[1] - box.lo[1], box.hi[0] - box.lo[0]), job.channel.dtype)
                data[(0, *box.slices_zyx(region.lo))] = pixels[None]
            self.direct.write(Cutout(job.channel, 0, region, range(sc.t, sc.t + 1)), data)
            self.index.mark_counted(job.name, job.row(sc), "built", "supercuboids_built")
        self.queues.send(self.url(job.queue("cleanup")), [_supercuboid_task(job, sc)])

    # -- phase 3: clean up -----------------------------------------------------------------------
    def cleanup(self, body: str) -> None:
        job_id, sc = _parse_supercuboid_task(body)
        job = self.job(job_id)
        job.layout.region_of(sc)  # InvalidRequest for a supercuboid the job does not write
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

