"""Tile ingest: the job's description, the upload work the service hands out, and the three
phases of the pipeline that the lambdas (or the local runner) call: a tile arrived, build a
supercuboid, clean up its tiles; and the removal of a stopped job, a bounded batch at a time.

A task leaves its queue only after the next phase's task is queued (the caller deletes a message
only when its phase returned); every phase can run twice with the same result.

The server alone decides what a job writes where (DESIGN §9). Uploaders hold no credentials for
the queues, the tile index or the bucket: through the service they lease upload tasks of their
own job, and get, per leased tile, a PUT that carries the service's signature of the tile's key,
content digest, size, lease and the uploader's leave on the job. A job's target (channel, box,
dtype, tile size) is read from a record the service sealed with its secret. A handler ingests a
tile only if the service signed its leave, the job is not stopped, the uploader's leave still
stands (the service revokes it when the uploader loses write permission), the tile came before
its lease ended and is no larger than its job's tiles can be; it removes any other tile it is
told of (docs/design/ingest.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ndstore.core.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge, StorageError
from ndstore.core.geometry import Box
from ndstore.core.signing import BadSignature, Signer
from ndstore.core.tiles import SupercuboidRef, TileLayout, TileRef, decode_tile, parse_tile_key, tile_key
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import (
    ExclusiveLocks,
    JobState,
    QueueCounts,
    TileHead,
    TileStore,
    Triggers,
    UploadTarget,
    WorkQueue,
)

log = logging.getLogger("ndstore.ingest")
PHASES = ("upload", "supercuboid", "cleanup")
# A tile's metadata (x-amz-meta-* in S3): its lease (the task's receipt, wrapped), the SHA-256 and
# size of the content its uploader was given leave to send, the uploader's leave on the job
# (`<uploader>.<leave>`), and the service's signature of all of them with the tile's key.
RECEIPT, SHA256, SIZE, LEAVE, SIGNATURE = ("upload-receipt", "upload-sha256", "upload-size", "upload-leave",
                                          "upload-signature")
MANIFEST_CHUNK = 500  # upload tasks queued per lease while the manifest is not all queued
MAX_LEASE = 100
UPLOAD_URL_S = 3600  # the longest an upload URL works; never past its task's lease
CLOCK_SLACK_S = 5  # a tile stored this long after its lease ended still counts as on time
REAP_TILES = 1000  # manifest tiles whose tiles and rows one removal step deletes
_SHA256 = re.compile(r"\A[0-9a-f]{64}\Z")
_UPLOADER = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
_LEASE = re.compile(r"\A([0-9]{1,12})\.([A-Za-z0-9_-]{1,64})\.([0-9a-f]{64})\.(.+)\Z", re.DOTALL)


class Refused(InvalidRequest):
    """A tile or task the pipeline will not ingest: not its job's, not signed, not as signed,
    too large, late, or its job stopped or its uploader's leave revoked."""


class LeaseNotHeld(InvalidRequest):
    """A task named by an uploader that it does not hold on lease now (expired, another's, forged)."""


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
    visibility_s: int = 0  # how long a lease lasts; 0: the service's default (records from before)

    @property
    def layout(self) -> TileLayout:
        return TileLayout(Box(*self.box), self.tile_x, self.tile_y, range(self.t_start, self.t_stop),
                          self.channel.grid(0))

    @property
    def name(self) -> str:
        return str(self.job_id)

    @property
    def max_tile_bytes(self) -> int:
        return self.layout.max_tile_bytes(self.channel.dtype.itemsize)

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


def _reap_task(job_id: int, start: int, delete_tiles: bool) -> str:
    return json.dumps({"reap": job_id, "from": start, "tiles": delete_tiles})


@dataclass(frozen=True)
class Lease:
    """An upload task given to the job's uploader: the tile, and the receipt that names the
    lease (the service's signature of the tile, the uploader and the lease's end, with the
    queue's receipt of the task)."""

    tile: TileRef
    receipt: str


@dataclass(frozen=True)
class TileUpload:
    """What an uploader sends once it has read a leased tile: its content's SHA-256 and size."""

    tile: TileRef
    receipt: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Leave:
    """A tile's leave to be ingested, as its signed metadata says."""

    uploader: str
    leave: str
    until: float  # when its lease ended
    receipt: str  # the queue's receipt of its upload task
    sha256: str
    size: int


def tile_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class Ingest:
    """The ingest pipeline's state (tile index, queues, tile bucket) and its three phases."""

    def __init__(self, tiles: TileStore, index: JobState, queues: WorkQueue, direct: CoherentDirect,
                 queue_prefix: str, visibility_s: int, max_tries: int, signer: Signer, locks: ExclusiveLocks,
                 triggers: tuple[Triggers, dict[str, str]] | None = None, clock: Callable[[], float] = time.time):
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
        self.clock = clock
        self._jobs: dict[int, IngestJob] = {}
        self._urls: dict[str, str] = {}
        self._ready = False

    # -- set-up ----------------------------------------------------------------------------------
    @property
    def events_queue(self) -> str:
        return f"{self.queue_prefix}-tile-events"

    @property
    def reap_queue(self) -> str:
        """Where the removal of stopped jobs goes, a bounded step per task (the cleanup handler's)."""
        return f"{self.queue_prefix}-reap"

    def ensure_ready(self, notify_events_queue: bool) -> None:
        """The tile bucket and index and the removal queue; with `notify_events_queue`, the
        bucket's ObjectCreated events go to the events queue (where no S3 -> Lambda trigger exists)."""
        self.index.ensure_ready()
        arn = None
        if notify_events_queue:
            arn = self.queues.arn(self.queues.create(self.events_queue, self.visibility_s, self.max_tries))
        self.tiles.ensure_ready(arn)
        self._reap_url()

    def _reap_url(self) -> str:
        """The removal queue (made if missing: a service that stops a job created before it
        existed), mapped to the cleanup function where Lambda runs the handlers."""
        if self.reap_queue not in self._urls:
            url = self.queues.create(self.reap_queue, self.visibility_s, self.max_tries)
            if self.triggers and "cleanup" in self.triggers[1]:
                self.triggers[0].attach(self.queues.arn(url), self.triggers[1]["cleanup"])
            self._urls[self.reap_queue] = url
        return self._urls[self.reap_queue]

    def create(self, job: IngestJob, visibility_s: int | None = None,
               notify_events_queue: bool = True) -> dict[str, str]:
        """Record the job and create its queues (each with a dead-letter queue); idempotent.
        `visibility_s`: how long its leases last (the service's default when None)."""
        if not self._ready:
            self.ensure_ready(notify_events_queue)
            self._ready = True
        job = replace(job, visibility_s=visibility_s or job.visibility_s or self.visibility_s)
        self.index.put_job(job.name, self.signer.seal(job.name, job.to_json()))
        urls = {phase: self.queues.create(job.queue(phase), job.visibility_s, self.max_tries) for phase in PHASES}
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

    # -- leases: upload work, handed out by the service ------------------------------------------
    def lease(self, job: IngestJob, count: int, uploader: str) -> list[Lease]:
        """Up to `count` upload tasks of the job for `uploader`, hidden from other uploaders for
        the job's lease time; each lease's receipt says (signed) whose it is and when it ends.
        While the manifest is not all queued, the next chunk is queued first, by one caller at a
        time (one that dies between queueing a chunk and recording it leaves that chunk to be
        queued again: its tiles' tasks then come twice, and the second upload of a tile is
        recorded as a duplicate). Tasks whose tile the index holds already are deleted, not
        handed out. Its work is O(count + MANIFEST_CHUNK), however long the job or its queue."""
        _check_uploader(uploader)
        lease_s = self.job(job.job_id).visibility_s or self.visibility_s
        self._queue_manifest_chunk(job)
        upload_url = self.url(job.queue("upload"))
        until = int(self.clock()) + lease_s  # the queue hides them at least this long
        leases: list[Lease] = []
        for message in self.queues.receive(upload_url, min(count, MAX_LEASE), wait_s=1, visibility_s=lease_s):
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
                leases.append(Lease(tile, self._lease_receipt(job, tile, uploader, until, message.receipt)))
        return leases

    def _lease_receipt(self, job: IngestJob, tile: TileRef, uploader: str, until: int, receipt: str) -> str:
        signature = self.signer.sign("lease", job.name, _tile_text(tile), str(until), uploader, receipt)
        return f"{until}.{uploader}.{signature}.{receipt}"

    def _held(self, job: IngestJob, lease: Lease, uploader: str, now: float) -> tuple[int, str]:
        """(when the lease ends, the queue's receipt of its task) if `uploader` holds the tile's
        task on lease now; LeaseNotHeld otherwise."""
        found = _LEASE.match(lease.receipt) if len(lease.receipt) <= 2048 else None
        if found is None or found[2] != uploader or not self.signer.verify(
                found[3], "lease", job.name, _tile_text(lease.tile), found[1], found[2], found[4]):
            raise LeaseNotHeld(f"tile {lease.tile} is not on lease to you: lease its task first "
                               f"(POST /v1/ingest/{job.job_id}/tasks/) and send the receipt that came with it")
        if int(found[1]) <= now:
            raise LeaseNotHeld(f"the lease of tile {lease.tile} ended {now - int(found[1]):.0f} s ago: lease its task "
                               "again")
        return int(found[1]), found[4]

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
            batch = [upload_task(job, t) for _, t in zip(range(MANIFEST_CHUNK), job.layout.manifest(sent))]
            self.queues.send(self.url(job.queue("upload")), batch)
            self.index.advance_manifest(job.name, sent, sent + len(batch))

    # -- leave to upload ---------------------------------------------------------------------------
    def grant_uploads(self, job: IngestJob, uploads: Sequence[TileUpload], uploader: str) -> list[UploadTarget]:
        """A PUT per tile whose task `uploader` holds on lease (LeaseNotHeld otherwise), of its
        declared size (PayloadTooLarge past the job's bound), for its key only, working until
        the lease ends (an hour at most), whose metadata carries the service's signature of
        (key, SHA-256, size, lease, the uploader's leave on the job). Conflict once the job is stopped."""
        _check_uploader(uploader)
        now = self.clock()
        ends = [self._checked_upload(job, upload, uploader, now) for upload in uploads]  # all, before any URL
        leave = self.index.open_leave(job.name, uploader)
        if leave is None:
            raise Conflict(f"ingest job {job.job_id} is stopped (cancelled or completed): it takes no more tiles")
        targets = []
        for upload, until in zip(uploads, ends):
            key = job.tile_key(upload.tile)
            metadata = self._leave(key, upload.sha256, upload.size, upload.receipt, f"{uploader}.{leave}")
            targets.append(self.tiles.upload_target(key, metadata, max(1, min(UPLOAD_URL_S, int(until - now))),
                                                    upload.size))
        return targets

    def _checked_upload(self, job: IngestJob, upload: TileUpload, uploader: str, now: float) -> int:
        """When the upload's lease ends, once the upload is found to be one the job takes."""
        job.layout.ordinal(upload.tile)  # InvalidRequest for a tile that is not the job's
        if not _SHA256.match(upload.sha256):
            raise InvalidRequest(f"sha256 of tile {upload.tile} must be 64 lowercase hex digits")
        if isinstance(upload.size, bool) or not isinstance(upload.size, int) or upload.size < 1:
            raise InvalidRequest(f"size of tile {upload.tile} must be its file's length in bytes, a positive integer")
        if upload.size > job.max_tile_bytes:
            raise PayloadTooLarge(f"tile {upload.tile} is {upload.size} bytes; this job's tiles hold at most "
                                  f"{job.max_tile_bytes} (twice its {job.tile_x}x{job.tile_y} voxels of "
                                  f"{job.channel.dtype.itemsize} bytes, plus 64 KiB)")
        return self._held(job, Lease(upload.tile, upload.receipt), uploader, now)[0]

    def put_tile(self, job: IngestJob, tile: TileRef, body: bytes, receipt: str = "no-task",
                 uploader: str = "service") -> str:
        """Store a tile the service received itself, as a PUT it granted `uploader` would, with
        a lease of the longest upload URL; returns its key."""
        job.layout.ordinal(tile)
        key = job.tile_key(tile)
        leave = self.index.open_leave(job.name, uploader)
        if leave is None:
            raise Conflict(f"ingest job {job.job_id} is stopped (cancelled or completed): it takes no more tiles")
        lease = self._lease_receipt(job, tile, uploader, int(self.clock()) + UPLOAD_URL_S, receipt)
        self.tiles.put(key, body, self._leave(key, tile_digest(body), len(body), lease, f"{uploader}.{leave}"))
        return key

    def _leave(self, key: str, sha256: str, size: int, receipt: str, leave: str) -> dict[str, str]:
        """The metadata that gives a tile leave to be ingested: the service's signature of it."""
        return {RECEIPT: receipt, SHA256: sha256, SIZE: str(size), LEAVE: leave,
                SIGNATURE: self.signer.sign("leave", key, sha256, str(size), receipt, leave)}

    def report_failed(self, job: IngestJob, failures: Sequence[tuple[Lease, str]], uploader: str) -> int:
        """Tiles the uploader holds on lease but could not read or that failed its checks: to
        the dead-letter queue with the reason (listed by status, requeued by retry_failed), their
        tasks deleted. LeaseNotHeld (nothing done) for one it does not hold."""
        _check_uploader(uploader)
        now = self.clock()
        receipts = []
        for lease, _ in failures:
            job.layout.ordinal(lease.tile)
            receipts.append(self._held(job, lease, uploader, now)[1])
        upload_url, dlq = self.url(job.queue("upload")), self.url(f"{job.queue('upload')}-dlq")
        for (lease, error), receipt in zip(failures, receipts):
            self.queues.send(dlq, [failed_upload_task(upload_task(job, lease.tile), error[:1000])])
            self.queues.delete_message(upload_url, receipt)
        return len(failures)

    # -- what a handler ingests ------------------------------------------------------------------
    def _verify(self, key: str, metadata: dict[str, str], body: bytes | None = None) -> Leave:
        """The tile's leave, if the service gave it (and, given its bytes, they are as signed)."""
        sha, size, receipt, leave, signature = (metadata.get(k, "") for k in (SHA256, SIZE, RECEIPT, LEAVE, SIGNATURE))
        if not signature or not self.signer.verify(signature, "leave", key, sha, size, receipt, leave):
            raise Refused(f"tile {key} does not carry the service's signature: it was not uploaded with leave "
                          "from this service (or its metadata was changed)")
        lease, (uploader, _, token) = _LEASE.match(receipt), leave.partition(".")
        if lease is None or not size.isdigit():
            raise Refused(f"tile {key} carries a leave of an older form; it is uploaded again")
        if body is not None and (len(body) != int(size) or tile_digest(body) != sha):
            raise Refused(f"tile {key} is not the content its uploader was given leave to send (size or SHA-256 "
                          "differs)")
        return Leave(uploader, token, float(lease[1]), lease[4], sha, int(size))

    @staticmethod
    def _standing(job: IngestJob, key: str, leave: Leave, leaves: dict[str, str] | None) -> None:
        """Refused unless the job is live and the uploader's leave on it still stands."""
        if leaves is None:
            raise Refused(f"ingest job {job.job_id} is stopped (cancelled or completed): tile {key} is not ingested")
        if leaves.get(leave.uploader) != leave.leave:
            raise Refused(f"the leave of uploader {leave.uploader} on ingest job {job.job_id} was revoked (it no "
                          f"longer holds write permission): tile {key} is not ingested")

    def _admit(self, job: IngestJob, key: str, head: TileHead) -> Leave:
        """The tile's leave, if it is one to record: signed, standing, on time and of its size."""
        leave = self._verify(key, head.metadata)
        self._standing(job, key, leave, self.index.leaves(job.name))
        if head.stored_at > leave.until + CLOCK_SLACK_S:
            raise Refused(f"tile {key} arrived {head.stored_at - leave.until:.0f} s after its lease ended")
        if head.size != leave.size or head.size > job.max_tile_bytes:
            raise Refused(f"tile {key} holds {head.size} bytes; its leave was for {leave.size} (at most "
                          f"{job.max_tile_bytes})")
        return leave

    def check_upload(self, key: str, metadata: dict[str, str]) -> None:
        """Before a tile PUT the service takes itself is read (the local tile store's route):
        Conflict unless its job is live and the leave it carries stands."""
        try:
            job_id, _ = parse_tile_key(key)
            job = self.job(job_id)
            self._standing(job, key, self._verify(key, metadata), self.index.leaves(job.name))
        except NotFound as exc:
            raise Conflict(f"tile {key} is not taken: its ingest job is stopped and removed") from exc
        except (ValueError, BadSignature, Refused) as exc:
            raise Conflict(f"tile {key} is not taken: {exc}") from exc

    # -- phase 1: a tile arrived -----------------------------------------------------------------
    def tile_uploaded(self, key: str) -> str:
        """Record the tile, delete its upload task, queue its supercuboid's task when it was the
        last tile missing. A tile it will not ingest (see _admit), or of a job that is gone, is
        deleted. Returns what happened (for logs and tests)."""
        try:
            job_id, tile = parse_tile_key(key)
            job = self.job(job_id)
            if key != job.tile_key(tile):
                raise Refused(f"{key} is not the key of tile {tile} of job {job_id}")
            job.layout.ordinal(tile)  # InvalidRequest: not a tile of the job's manifest
        except NotFound as exc:  # its job was removed (completed, cancelled): nothing may ingest it
            log.warning("removing %s: %s", key, exc)
            self.tiles.delete_many([key])
            return "ignored"
        except (ValueError, BadSignature, InvalidRequest) as exc:  # not a tile of a job we know
            log.warning("ignoring %s: %s", key, exc)
            return "ignored"
        head = self.tiles.head(key)
        if head is None:
            return "gone"  # cleaned up already: a late duplicate event
        try:
            leave = self._admit(job, key, head)
        except Refused as exc:
            log.warning("refusing and removing %s: %s", key, exc)
            self.tiles.delete_many([key])
            return "refused"
        return self._record(job, key, tile, leave)

    def _record(self, job: IngestJob, key: str, tile: TileRef, leave: Leave) -> str:
        layout = job.layout
        sc = layout.supercuboid_of(tile)
        row = job.row(sc)
        new = self.index.record_tile(job.name, row, layout.ordinal(tile), layout.tile_count_of(sc))
        try:
            self.queues.delete_message(self.url(job.queue("upload")), leave.receipt)
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
        no cached copy goes stale), then queue its cleanup. A stopped job's is not built."""
        job_id, sc = _parse_supercuboid_task(body)
        job = self.job(job_id)
        region = job.layout.region_of(sc)  # InvalidRequest for a supercuboid the job does not write
        leaves = self.index.leaves(job.name)
        if leaves is None:
            log.info("ingest job %d is stopped: supercuboid %s t=%d is not built", job_id, sc.index, sc.t)
            return
        state = self.index.supercuboid(job.row(sc))
        if not state["cleaned"]:  # a rerun after cleanup must not read tiles that are gone
            data = self._assemble(job, sc, region, leaves)
            self.direct.write(Cutout(job.channel, 0, region, range(sc.t, sc.t + 1)), data)
            self.index.mark_counted(job.name, job.row(sc), "built", "supercuboids_built")
        self.queues.send(self.url(job.queue("cleanup")), [_supercuboid_task(job, sc)])

    def _assemble(self, job: IngestJob, sc: SupercuboidRef, region: Box, leaves: dict[str, str]) -> np.ndarray:
        """The supercuboid's part of the job, decoded into one array a tile at a time as the
        store hands them over (never all tiles' bytes at once); Refused (nothing written) for a
        tile without a standing leave or as signed, or larger than its job's bound."""
        layout = job.layout
        data = np.zeros((1, *region.shape_zyx), job.channel.dtype)
        tiles = {job.tile_key(t): t for t in layout.tiles_of(sc)}
        try:
            for key, found in self.tiles.get_many_with_metadata(list(tiles), job.max_tile_bytes):
                if found is None:
                    raise StorageError(f"supercuboid {sc.index} t={sc.t} of job {job.job_id}: tile {key} is missing")
                self._standing(job, key, self._verify(key, found[1], found[0]), leaves)
                box = layout.tile_box(tiles[key])
                pixels = decode_tile(found[0], f"tile {key}", (job.tile_y, job.tile_x),
                                     (box.hi[1] - box.lo[1], box.hi[0] - box.lo[0]), job.channel.dtype)
                data[(0, *box.slices_zyx(region.lo))] = pixels[None]
                del found, pixels
        except PayloadTooLarge as exc:
            raise Refused(str(exc)) from exc
        return data

    # -- phase 3: clean up (and the removal of stopped jobs, on the same handler) -----------------
    def cleanup(self, body: str) -> None:
        task = json.loads(body)
        if isinstance(task, dict) and "reap" in task:
            self.reap(task)
            return
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

    def leaves(self, job_id: int) -> dict[str, str] | None:
        """Uploader -> leave of each uploader whose leave on the job stands; None once stopped."""
        return self.index.leaves(str(job_id))

    def revoke(self, job_id: int, uploader: str) -> None:
        """The uploader's leave on the job stands no more: its tiles not yet built are refused."""
        self.index.revoke_leave(str(job_id), uploader)

    def stop(self, job: IngestJob, delete_tiles: bool) -> None:
        """Stop the job (completed, or cancelled: then with its tiles) in O(1): from now on the
        handlers refuse its tiles and build nothing more of it; its queues go; its tiles and
        rows are removed in the background (`reap`), REAP_TILES at a time. Supercuboids built
        stay. Idempotent: a stop that failed half way is repeated whole."""
        self.index.stop(job.name)
        for phase in PHASES:
            url = self.queues.url(job.queue(phase))
            if self.triggers and url and phase in self.triggers[1]:
                self.triggers[0].detach(self.queues.arn(url))
            self.queues.delete(job.queue(phase))
            self._urls.pop(job.queue(phase), None)
        self.queues.send(self._reap_url(), [_reap_task(job.job_id, 0, delete_tiles)])

    def reap(self, task: dict[str, Any]) -> None:
        """One step of a stopped job's removal: the tiles (if it was cancelled) and rows of the
        next REAP_TILES tiles of its manifest as far as it was queued (no tile past it was ever
        leased), then the next step's task; the last step deletes the job's own row."""
        job_id, start, delete_tiles = int(task["reap"]), int(task["from"]), bool(task.get("tiles"))
        try:
            job = self.job(job_id)
        except NotFound:
            return  # removed already: a step run twice
        if self.index.leaves(job.name) is not None:
            raise Refused(f"ingest job {job_id} is not stopped: it is not removed")
        sent = self.index.job(job.name)["manifest_sent"]
        tiles = [t for _, t in zip(range(max(0, min(REAP_TILES, sent - start))), job.layout.manifest(start))]
        if delete_tiles and tiles:
            self.tiles.delete_many([job.tile_key(t) for t in tiles])
        rows = sorted({job.row(job.layout.supercuboid_of(t)) for t in tiles})
        end = start + len(tiles)
        if end < sent:
            self.index.delete(rows)
            self.queues.send(self._reap_url(), [_reap_task(job_id, end, delete_tiles)])
        else:
            self.index.delete([*rows, job.name])
            self._jobs.pop(job_id, None)


def _check_uploader(uploader: str) -> None:
    if not _UPLOADER.match(uploader):
        raise InvalidRequest(f"{uploader!r:.80} is not an uploader's name")


def _tile_text(tile: TileRef) -> str:
    return f"{tile.t},{tile.z},{tile.y_index},{tile.x_index}"


def _failed(task: dict[str, Any]) -> dict[str, str]:
    return {"key": str(task.get("key", "")), "error": str(task.get("error", "failed after repeated tries"))}


def failed_upload_task(body: str, error: str) -> str:
    """An upload task as the client sends it to the dead-letter queue: with what went wrong."""
    return json.dumps({**json.loads(body), "error": error})
