"""`ndstore ingest`: the tile-upload client a lab runs next to its microscope.

It creates (or resumes) an ingest job through the service, fills the job's upload queue with the
manifest of tile names once, then runs N uploader processes: each takes a task from the queue,
reads the tile from local disk, checks it, and puts it into the tile bucket with the task's
receipt as metadata; the pipeline's first handler deletes the task when it records the tile.
Killed at any moment and started again, it resumes from the queue: a task whose tile the index
already holds is dropped without an upload; a task a killed uploader held comes back after the
queue's visibility timeout. A tile that is missing or malformed goes to the dead-letter queue with
the reason, is listed in the summary, and can be requeued after it is fixed (`--retry-failed`).
"""

from __future__ import annotations

import importlib
import io
import json
import multiprocessing
import queue as queue_lib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from PIL import Image
from tqdm import tqdm

from ndstore.core.errors import InvalidBody, InvalidRequest, StorageError
from ndstore.core.tiles import TileRef
from ndstore.engine.ingest import IngestJob, failed_upload_task, fill_manifest, parse_upload_task
from ndstore.storage.sqs import Message, SqsQueues
from ndstore.storage.tile_bucket import QUEUE, RECEIPT, S3TileBucket
from ndstore.storage.tile_index import DynamoTileIndex

Reader = Callable[[TileRef], "bytes | Path"]


@dataclass(frozen=True)
class TileSource:
    """Where tiles are on local disk: `root / pattern.format(...)` with the fields t, z, y and x
    (tile indices) and x0, y0 (the tile's first voxel), or a plug-in `module:function` that takes
    a TileRef and returns the tile's bytes or path."""

    root: Path
    pattern: str = "{z:04d}/{y}_{x}.png"
    plugin: str | None = None

    def reader(self, tile_x: int, tile_y: int) -> Reader:
        if self.plugin:
            module, _, name = self.plugin.partition(":")
            fn: Reader = getattr(importlib.import_module(module), name)
            return fn

        def from_pattern(tile: TileRef) -> Path:
            return self.root / self.pattern.format(t=tile.t, z=tile.z, y=tile.y_index, x=tile.x_index,
                                                   x0=tile.x_index * tile_x, y0=tile.y_index * tile_y)
        return from_pattern


@dataclass
class Summary:
    uploaded: int = 0
    skipped: int = 0  # the index held the tile already (a resumed run)
    bytes: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"uploaded": self.uploaded, "skipped": self.skipped, "failed": self.failed,
                "MB": round(self.bytes / 1e6, 3), "seconds": round(self.seconds, 2),
                "MB_per_s": round(self.bytes / 1e6 / self.seconds, 2) if self.seconds else 0.0}


class IngestClient:
    def __init__(self, server: str, token: str | None, timeout_s: float = 60):
        self.server = server.rstrip("/")
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Token {token}"
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self.http.request(method, f"{self.server}/v1/ingest/{path}", timeout=self.timeout_s, **kwargs)
        if r.status_code >= 400:
            raise InvalidRequest(f"the service answered {r.status_code} to {method} /v1/ingest/{path}: {r.text}")
        return r.json() if r.content else None

    def create(self, fields: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "", json=fields)  # type: ignore[no-any-return]

    def get(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"{job_id}/")  # type: ignore[no-any-return]

    def retry_failed(self, job_id: int) -> int:
        return int(self._call("POST", f"{job_id}/retry/")["requeued"])

    def complete(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"{job_id}/complete/")  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Endpoints:
    """What an uploader process needs to reach the pipeline (picklable)."""

    endpoint_url: str | None
    region: str
    tile_bucket: str
    tile_index_table: str
    spec: str

    @classmethod
    def of(cls, job: dict[str, Any]) -> _Endpoints:
        return cls(job["endpoint_url"], job["region"], job["tile_bucket"], job["tile_index_table"], job["spec"])

    def adapters(self) -> tuple[IngestJob, S3TileBucket, DynamoTileIndex, SqsQueues]:
        _local_credentials(self.endpoint_url)
        return (IngestJob.from_json(self.spec), S3TileBucket(self.tile_bucket, self.endpoint_url, self.region, 4),
                DynamoTileIndex(self.tile_index_table, self.endpoint_url, self.region),
                SqsQueues(self.endpoint_url, self.region))


def _local_credentials(endpoint_url: str | None) -> None:
    """`ndstore up`'s ingest endpoint (moto, on loopback) takes any credentials, but boto3 sends
    none without some: give it placeholders there, and only there, when none are configured."""
    import os
    from urllib.parse import urlparse

    import boto3

    host = urlparse(endpoint_url or "").hostname
    if host in ("127.0.0.1", "localhost", "::1") and boto3.session.Session().get_credentials() is None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")


def check_tile(body: bytes, what: str, job: IngestJob, tile: TileRef) -> None:
    """A cheap look at the image header: readable, one band, the tile's size."""
    box = job.layout.tile_box(tile)
    clipped = (box.hi[0] - box.lo[0], box.hi[1] - box.lo[1])
    try:
        with Image.open(io.BytesIO(body)) as image:
            size, bands = image.size, len(image.getbands())
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidBody(f"{what} is not a readable PNG/TIFF image: {exc}") from exc
    if bands != 1:
        raise InvalidBody(f"{what} has {bands} bands; tiles must be single-channel (greyscale) images")
    if size not in ((job.tile_x, job.tile_y), clipped):
        raise InvalidBody(f"{what} is {size[0]}x{size[1]} pixels; expected {job.tile_x}x{job.tile_y} "
                          f"(or {clipped[0]}x{clipped[1]} at the box edge)")


def _uploader(endpoints: _Endpoints, source: TileSource, reports: Any, stop: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us through `stop`
    job, tiles, index, queues = endpoints.adapters()
    upload_url = queues.url(job.queue("upload"))
    dlq_url = queues.url(f"{job.queue('upload')}-dlq")
    if upload_url is None or dlq_url is None:
        reports.put(("fatal", f"the upload queue of job {job.job_id} does not exist (completed or cancelled?)", 0))
        return
    read = source.reader(job.tile_x, job.tile_y)
    while not stop.is_set():
        try:
            messages = queues.receive(upload_url, 10, wait_s=1)
        except StorageError as exc:  # a flaky network: keep trying; the tasks wait in the queue
            reports.put(("retry", "the upload queue", str(exc)))
            stop.wait(2)
            continue
        for message in messages:
            try:
                _upload_one(message, job, tiles, index, queues, upload_url, dlq_url, read, reports)
            except StorageError as exc:  # the task stays in the queue and comes back after its timeout
                reports.put(("retry", parse_upload_task(message.body)[2], str(exc)))


def _upload_one(message: Message, job: IngestJob, tiles: S3TileBucket, index: DynamoTileIndex, queues: SqsQueues,
                upload_url: str, dlq_url: str, read: Reader, reports: Any) -> None:
    layout = job.layout
    _, tile, key = parse_upload_task(message.body)
    row = job.row(layout.supercuboid_of(tile))
    if index.has_tile(row, layout.ordinal(tile)):
        queues.delete_message(upload_url, message.receipt)
        reports.put(("skipped", key, 0))
        return
    try:
        where = read(tile)
        what = f"tile {tile} ({where})" if isinstance(where, Path) else f"tile {tile}"
        body = where.read_bytes() if isinstance(where, Path) else where
        check_tile(body, what, job, tile)
    except (OSError, InvalidBody) as exc:
        error = f"file {exc.filename} cannot be read: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
        queues.send(dlq_url, [failed_upload_task(message.body, error)])
        queues.delete_message(upload_url, message.receipt)
        reports.put(("failed", key, error))
        return
    tiles.put(key, body, {RECEIPT: message.receipt, QUEUE: upload_url})
    reports.put(("uploaded", key, len(body)))


def run_ingest(client: IngestClient, job: dict[str, Any], source: TileSource, processes: int = 4,
               progress: bool = True, poll_s: float = 1.0, echo: Callable[[str], None] = print) -> Summary:
    """Fill the manifest, upload every tile, and wait until the pipeline recorded them all."""
    started = time.monotonic()
    endpoints = _Endpoints.of(job)
    spec, _, index, queues = endpoints.adapters()
    upload_url = queues.url(spec.queue("upload"))
    if upload_url is None:
        raise InvalidRequest(f"ingest job {spec.job_id} has no upload queue: it is {job['state']}")
    total = spec.layout.tile_count()
    with tqdm(total=total, desc="queueing tasks", unit="task", disable=not progress) as bar:
        bar.update(index.job(spec.name)["manifest_sent"])
        for sent in fill_manifest(spec, index, queues, upload_url):
            bar.update(sent - bar.n)
    summary = Summary()
    context = multiprocessing.get_context("spawn")
    reports, stop = context.Queue(), context.Event()
    procs = [context.Process(target=_uploader, args=(endpoints, source, reports, stop), daemon=True)
             for _ in range(processes)]
    for p in procs:
        p.start()
    done_before = index.job(spec.name)["tiles_uploaded"]
    bar = tqdm(total=total, initial=done_before, desc=f"job {spec.job_id} tiles", unit="tile", disable=not progress)
    idle_polls, next_poll = 0, time.monotonic() + poll_s
    try:
        while idle_polls < 2:
            try:
                kind, key, value = reports.get(timeout=0.2)
                if kind == "fatal":
                    raise InvalidRequest(str(key))
                if kind == "uploaded":
                    summary.uploaded += 1
                    summary.bytes += int(value)
                    bar.update(1)
                    bar.set_postfix(MBps=f"{summary.bytes / 1e6 / max(1e-6, time.monotonic() - started):.1f}")
                elif kind == "skipped":
                    summary.skipped += 1
                elif kind == "retry":
                    bar.write(f"will retry {key}: {value}")
                else:
                    summary.failed.append({"key": str(key), "error": str(value)})
                    bar.write(f"failed: {key}: {value}")
            except queue_lib.Empty:
                pass
            if time.monotonic() >= next_poll:
                counts = queues.counts(upload_url)
                idle_polls = idle_polls + 1 if counts.total == 0 else 0
                next_poll = time.monotonic() + poll_s
                if not any(p.is_alive() for p in procs):
                    raise InvalidRequest("every uploader process exited; see the messages above")
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        bar.close()
    summary.seconds = time.monotonic() - started
    status = client.get(spec.job_id).get("status", {})
    echo(json.dumps({"job": spec.job_id, **summary.as_dict(), "pipeline": status}, indent=1))
    return summary
