"""`ndstore ingest`: the tile-upload client a lab runs next to its microscope.

It creates (or resumes) an ingest job through the service and runs N uploader processes. The
client holds nothing but its NDStore token: each uploader leases upload tasks of its job from the
service (which queues the job's manifest as it goes), reads each tile from local disk, checks it,
and asks the service for leave to upload it: a presigned PUT to the tile bucket, signed for that
tile's key and that content's SHA-256 only. The pipeline's first handler records the tile and
deletes its task. Killed at any moment and started again, it resumes: the service hands out only
tasks whose tile is not recorded; a task a killed uploader held comes back after the queue's
visibility timeout. A tile that is missing or malformed is reported to the service with the reason
(the job's dead-letter queue), listed in the summary, and can be requeued after it is fixed
(`--retry-failed`).

The uploader processes die with the client however it ends (Ctrl-C, `kill`, `kill -9`): each asks
Linux to kill it when its parent dies (PR_SET_PDEATHSIG) and also watches a pipe whose only
writer is the parent, which reads as closed the moment the parent is gone (any platform).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import io
import json
import multiprocessing
import os
import queue as queue_lib
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from PIL import Image
from tqdm import tqdm

from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.tiles import TileRef

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
    bytes: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"uploaded": self.uploaded, "failed": self.failed,
                "MB": round(self.bytes / 1e6, 3), "seconds": round(self.seconds, 2),
                "MB_per_s": round(self.bytes / 1e6 / self.seconds, 2) if self.seconds else 0.0}


class ServiceRefused(InvalidRequest):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    @property
    def final(self) -> bool:
        """Asking again will not help (no token, no permission, no such job, job finished)."""
        return self.status in (401, 403, 404, 409)


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
            raise ServiceRefused(r.status_code, f"the service answered {r.status_code} to {method} /v1/ingest/{path}: "
                                                f"{r.text}")
        return r.json() if r.content else None

    def create(self, fields: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "", json=fields)  # type: ignore[no-any-return]

    def get(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"{job_id}/")  # type: ignore[no-any-return]

    def retry_failed(self, job_id: int) -> int:
        return int(self._call("POST", f"{job_id}/retry/")["requeued"])

    def complete(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"{job_id}/complete/")  # type: ignore[no-any-return]

    def lease(self, job_id: int, count: int) -> dict[str, Any]:
        return self._call("POST", f"{job_id}/tasks/", json={"max": count})  # type: ignore[no-any-return]

    def uploads(self, job_id: int, tiles: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._call("POST", f"{job_id}/uploads/", json={"tiles": tiles})["uploads"]  # type: ignore[no-any-return]

    def report_failed(self, job_id: int, tasks: list[dict[str, Any]]) -> int:
        return int(self._call("POST", f"{job_id}/tasks/failed/", json={"tasks": tasks})["failed"])


@dataclass(frozen=True)
class JobShape:
    """What an uploader needs to check a tile: the job's box and tile size (picklable)."""

    job_id: int
    box: tuple[tuple[int, int], tuple[int, int]]  # (x start, stop), (y start, stop)
    tile_x: int
    tile_y: int

    @classmethod
    def of(cls, job: dict[str, Any]) -> JobShape:
        box = job["box"]
        return cls(int(job["id"]), (tuple(box["x"]), tuple(box["y"])),  # type: ignore[arg-type]
                   int(job["tile_size"]["x"]), int(job["tile_size"]["y"]))

    def clipped(self, tile: TileRef) -> tuple[int, int]:
        """(width, height) of the tile's part inside the box."""
        x0, y0 = tile.x_index * self.tile_x, tile.y_index * self.tile_y
        return min(x0 + self.tile_x, self.box[0][1]) - x0, min(y0 + self.tile_y, self.box[1][1]) - y0


def check_tile(body: bytes, what: str, job: JobShape, tile: TileRef) -> None:
    """A cheap look at the image header: readable, one band, the tile's size."""
    clipped = job.clipped(tile)
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


@dataclass(frozen=True)
class _Connection:
    """How an uploader process reaches the service (picklable)."""

    server: str
    token: str | None
    timeout_s: float

    def client(self) -> IngestClient:
        return IngestClient(self.server, self.token, self.timeout_s)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid: int, lifeline: Any) -> None:
    """Exit when the parent process does, however it ends: SIGKILL from the kernel when it dies
    (Linux), and a thread that exits this process when `lifeline` (the read end of a pipe whose
    only write end the parent holds) reads as closed. A parent that died before the first was
    set is seen by getppid() no longer being it."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        try:
            lifeline.recv()  # the parent never sends: this returns only by raising, at EOF
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _uploader(connection: _Connection, shape: JobShape, source: TileSource, reports: Any, stop: Any,
              parent_pid: int, lifeline: Any) -> None:
    _die_with_parent(parent_pid, lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us through `stop`
    client, read = connection.client(), source.reader(shape.tile_x, shape.tile_y)
    store = requests.Session()  # no token: the tile store is reached with presigned URLs only
    while not stop.is_set():
        try:
            tasks = client.lease(shape.job_id, 10)["tasks"]
        except (ServiceRefused, requests.RequestException) as exc:
            if isinstance(exc, ServiceRefused) and exc.final:
                reports.put(("fatal", str(exc), 0))
                return
            reports.put(("retry", "leasing upload tasks", str(exc)))
            stop.wait(2)
            continue
        if not tasks:
            stop.wait(1)
            continue
        try:
            _upload_batch(client, store, shape, tasks, read, reports)
        except (ServiceRefused, requests.RequestException) as exc:  # the tasks come back after their timeout
            reports.put(("retry", f"{len(tasks)} tiles", str(exc)))


def _read_checked(task: dict[str, Any], shape: JobShape, read: Reader) -> bytes:
    tile = TileRef(*task["tile"])
    where = read(tile)
    what = f"tile {tile} ({where})" if isinstance(where, Path) else f"tile {tile}"
    body = where.read_bytes() if isinstance(where, Path) else where
    check_tile(body, what, shape, tile)
    return body


def _upload_batch(client: IngestClient, store: requests.Session, shape: JobShape, tasks: list[dict[str, Any]],
                  read: Reader, reports: Any) -> None:
    """Read and check each leased tile, report the ones that fail, upload the rest."""
    import hashlib

    bodies, failed = [], []
    for task in tasks:
        try:
            bodies.append((task, _read_checked(task, shape, read)))
        except (OSError, InvalidBody) as exc:
            error = f"file {exc.filename} cannot be read: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
            failed.append({**task, "error": error})
    if failed:
        client.report_failed(shape.job_id, failed)
        for task in failed:
            reports.put(("failed", str(TileRef(*task["tile"])), task["error"]))
    if not bodies:
        return
    targets = client.uploads(shape.job_id, [{**task, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
                                            for task, body in bodies])
    for (task, body), target in zip(bodies, targets):
        r = store.put(target["url"], data=body, headers=target["headers"], timeout=client.timeout_s)
        if r.status_code >= 300:
            reports.put(("retry", str(TileRef(*task["tile"])), f"the tile store answered {r.status_code}"))
        else:
            reports.put(("uploaded", str(TileRef(*task["tile"])), len(body)))


def run_ingest(client: IngestClient, job: dict[str, Any], source: TileSource, processes: int = 4,
               progress: bool = True, poll_s: float = 1.0, echo: Callable[[str], None] = print) -> Summary:
    """Upload every tile, and wait until the pipeline recorded them all (or they failed)."""
    started = time.monotonic()
    if job["state"] != "uploading":
        raise InvalidRequest(f"ingest job {job['id']} is {job['state']}; it takes no more tiles")
    shape = JobShape.of(job)
    summary = Summary()
    connection = _Connection(client.server, client.http.headers.get("Authorization", "").partition(" ")[2] or None,
                             client.timeout_s)
    total = int(job["tile_count"])
    bar = tqdm(total=total, desc=f"job {shape.job_id} tiles", unit="tile", disable=not progress)
    idle_polls, next_poll = 0, time.monotonic() + poll_s
    with _Uploaders(processes, connection, shape, source) as uploaders, bar:
        while idle_polls < 2:
            try:
                _take_report(uploaders.reports.get(timeout=0.2), summary, bar, started)
            except queue_lib.Empty:
                pass
            if time.monotonic() >= next_poll:
                status = client.get(shape.job_id).get("status") or {}
                bar.update(status.get("tiles", {}).get("uploaded", bar.n) - bar.n)
                upload = status.get("queues", {}).get("upload", {})
                finished = (status.get("tiles", {}).get("queued_for_upload") == total
                            and upload.get("waiting", 1) + upload.get("in_flight", 1) == 0)
                idle_polls = idle_polls + 1 if finished else 0
                next_poll = time.monotonic() + poll_s
                if not uploaders.alive():
                    raise InvalidRequest("every uploader process exited; see the messages above")
    summary.seconds = time.monotonic() - started
    status = client.get(shape.job_id).get("status", {})
    echo(json.dumps({"job": shape.job_id, **summary.as_dict(), "pipeline": status}, indent=1))
    return summary


class _Uploaders:
    """The uploader processes, for the length of a `with` block: stopped at its end however it
    ends (SIGTERM in the client raises KeyboardInterrupt, as Ctrl-C does), and tied to this
    process's life however it ends (a pipe only this process writes; see _die_with_parent)."""

    def __init__(self, count: int, connection: _Connection, shape: JobShape, source: TileSource):
        context = multiprocessing.get_context("spawn")
        self.reports, self._stop = context.Queue(), context.Event()
        self._lifeline, self._keep_alive = context.Pipe(duplex=False)  # the children hold the read end only
        self._procs = [context.Process(target=_uploader, daemon=True, args=(
            connection, shape, source, self.reports, self._stop, os.getpid(), self._lifeline)) for _ in range(count)]
        self._main = threading.current_thread() is threading.main_thread()
        self._previous: Any = None

    def __enter__(self) -> _Uploaders:
        if self._main:
            self._previous = signal.signal(signal.SIGTERM, _interrupted)
        for p in self._procs:
            p.start()
        self._lifeline.close()
        return self

    def alive(self) -> bool:
        return any(p.is_alive() for p in self._procs)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        self._keep_alive.close()
        if self._main:
            signal.signal(signal.SIGTERM, self._previous)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _take_report(report: tuple[str, str, Any], summary: Summary, bar: Any, started: float) -> None:
    kind, key, value = report
    if kind == "fatal":
        raise InvalidRequest(str(key))
    if kind == "uploaded":
        summary.uploaded += 1
        summary.bytes += int(value)
        bar.set_postfix(MBps=f"{summary.bytes / 1e6 / max(1e-6, time.monotonic() - started):.1f}")
    elif kind == "retry":
        bar.write(f"will retry {key}: {value}")
    else:
        summary.failed.append({"key": str(key), "error": str(value)})
        bar.write(f"failed: {key}: {value}")
