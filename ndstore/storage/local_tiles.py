"""TileStore in a local directory: the local stack's ingest tile bucket (what S3TileBucket is
on AWS). It owns the tiles on disk with their metadata, the signed upload URLs it hands to
uploaders that hold no credentials (a PUT to the service's own route
`/v1/ingest/tiles/<key>?expires=<unix s>&size=<bytes>&signature=<hex>`, which checks the
signature and the declared length before it reads the body, then calls `put`), and the
announcement of each new tile to a queue as the S3 ObjectCreated event S3 itself would send.

Layout under `root`: `objects/<key>~tile` holds one tile: a first line of JSON (its metadata),
a newline, then its bytes, written to a temporary file, fsynced and renamed, so a reader sees a
whole tile or none. A key's segments never contain `~`, so a tile's file never collides with
another key's folder, nor with a temporary file. `notify-queue.json` names the queue that
every store on this root announces new tiles to.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ndstore.core.errors import DataCorrupt, InvalidRequest, PayloadTooLarge, StorageError
from ndstore.core.signing import BadSignature, Signer
from ndstore.storage.interfaces import TileHead, UploadTarget, WorkQueue

MAX_KEY = 512
TILE_SUFFIX = "~tile"
_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")
_EXPIRES = re.compile(r"[0-9]{1,20}")
_NOTIFY_FILE = "notify-queue.json"
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
_PUT_TRIES = 3  # a folder emptied and removed by a concurrent delete between mkdir and write
_MAX_HEADER = 64 << 10  # a tile's metadata line: S3 allows 2 KB of user metadata


def check_key(key: str) -> str:
    """`key` if it is a safe relative path (`[A-Za-z0-9_.-]` segments joined by `/`, no empty,
    `.` or `..` segment, at most 512 characters); InvalidRequest otherwise."""
    segments = key.split("/")
    if len(key) > MAX_KEY or not all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        raise InvalidRequest(f"{key!r:.100} is not a tile key: `/`-separated segments of letters, digits, "
                             f"`_`, `.` and `-`, no `.` or `..` segment, at most {MAX_KEY} characters")
    return key


def canonical_metadata(metadata: dict[str, str]) -> str:
    """The metadata as the upload signature covers it: independent of the dict's order and of
    the case of its names (HTTP header names have none; S3 stores them in lower case)."""
    return json.dumps(sorted(_lower_names(metadata).items()))


def _lower_names(metadata: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in metadata.items()}


def s3_created_event(bucket: str, key: str, size: int, when: float) -> str:
    """The body of the S3 notification of a new object (what lambdas/ingest.py parses)."""
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    record = {"eventVersion": "2.1", "eventSource": "aws:s3", "eventTime": stamp, "eventName": "ObjectCreated:Put",
              "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": bucket},
                     "object": {"key": urllib.parse.quote_plus(key), "size": size}}}
    return json.dumps({"Records": [record]})


class LocalTileStore:
    def __init__(self, root: Path, public_url: str, signer: Signer, queues: WorkQueue, name: str = "tiles",
                 fsync: bool = True, clock: Callable[[], float] = time.time):
        """`public_url`: the service's base URL, where uploaders send their PUTs. `name`: the
        bucket name the notifications give."""
        self.root = Path(root)
        self.public_url = public_url
        self.signer = signer
        self.queues = queues
        self.name = name
        self.fsync = fsync
        self.clock = clock
        self._objects = self.root / "objects"
        self._urls: dict[str, str] = {}  # queue ARN -> URL

    # -- set-up -----------------------------------------------------------------------------------
    def ensure_ready(self, notify_queue_arn: str | None = None) -> None:
        """Create the root; with a queue's ARN, record it so that every store on this root
        (in any process) announces each new tile there. Without one, a recorded queue stays."""
        try:
            self._objects.mkdir(parents=True, exist_ok=True)
            if notify_queue_arn:
                data = json.dumps({"queue_arn": notify_queue_arn}).encode()
                self._write_atomically(self.root / _NOTIFY_FILE, data)
        except OSError as exc:
            raise StorageError(f"local tile store {self.root}: ensure_ready failed: {exc}") from exc

    def _notify_arn(self) -> str | None:
        """The recorded queue's ARN, read on each put: another process may have set it since."""
        try:
            return str(json.loads((self.root / _NOTIFY_FILE).read_bytes())["queue_arn"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"local tile store {self.root}: cannot read {_NOTIFY_FILE}: {exc}") from exc

    # -- uploads ----------------------------------------------------------------------------------
    def upload_target(self, key: str, metadata: dict[str, str], expires_s: int, size: int) -> UploadTarget:
        """A PUT of `size` bytes to `key` at the service, signed for exactly this key, size and
        metadata until `expires_s` seconds from now; the headers are those an S3 presigned PUT takes."""
        check_key(key)
        expires = str(int(self.clock()) + expires_s)
        signature = self.signer.sign("PUT", key, expires, str(size), canonical_metadata(metadata))
        url = (f"{self.public_url.rstrip('/')}/v1/ingest/tiles/{urllib.parse.quote(key)}"
               f"?expires={expires}&size={size}&signature={signature}")
        return UploadTarget(url, {f"x-amz-meta-{name}": value for name, value in metadata.items()})

    def check_leave(self, key: str, expires: str, size: str, signature: str, metadata: dict[str, str]) -> int:
        """The size `upload_target` signed this PUT for (this key, size, metadata, not expired);
        BadSignature otherwise: what the upload route checks before it reads the body."""
        check_key(key)
        if not isinstance(expires, str) or not _EXPIRES.fullmatch(expires):
            raise BadSignature(f"the upload of {key} has no valid expiry time")
        if int(expires) < self.clock():
            raise BadSignature(f"the upload URL of {key} expired")
        if not isinstance(size, str) or not _EXPIRES.fullmatch(size):
            raise BadSignature(f"the upload of {key} has no valid size")
        if not isinstance(signature, str) or not self.signer.verify(
                signature, "PUT", key, expires, size, canonical_metadata(metadata)):
            raise BadSignature(f"the upload of {key} is not one this service signed (key, size, metadata or expiry "
                               "changed, or forged)")
        return int(size)

    def accept(self, key: str, expires: str, size: str, signature: str, metadata: dict[str, str],
               body: bytes) -> None:
        """Store an uploader's PUT if `upload_target` signed it for this body's size;
        BadSignature (or InvalidRequest for another size), with nothing written, otherwise."""
        if self.check_leave(key, expires, size, signature, metadata) != len(body):
            raise InvalidRequest(f"the upload of {key} was signed for {size} bytes, not {len(body)}")
        self.put(key, body, metadata)

    # -- tiles ------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self._objects / (check_key(key) + TILE_SUFFIX)

    def put(self, key: str, body: bytes, metadata: dict[str, str]) -> None:
        """Store the tile and its metadata (names in lower case, as S3 keeps them) in one file,
        atomically; then announce it on the recorded queue, if any (StorageError if that fails:
        the tile is stored, a retried put stores and announces it again)."""
        path = self._path(key)
        header = json.dumps(_lower_names(metadata), separators=(",", ":")).encode()
        try:
            for attempt in range(_PUT_TRIES):
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self._write_atomically(path, header, b"\n", body)
                    break
                except FileNotFoundError:
                    if attempt == _PUT_TRIES - 1:
                        raise
        except OSError as exc:
            raise StorageError(f"local tile store {self.root}: cannot store tile {key}: {exc}") from exc
        self._announce(key, len(body))

    def _write_atomically(self, path: Path, *parts: bytes) -> None:
        """Write `parts` to a temporary file beside `path`, fsync it (if `fsync`), rename it."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix="~tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for part in parts:
                    f.write(part)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if self.fsync:  # the rename itself survives a power cut
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _announce(self, key: str, size: int) -> None:
        arn = self._notify_arn()
        if arn is None:
            return
        if arn not in self._urls:
            url = self.queues.url(arn.rsplit(":", 1)[-1])
            if url is None:
                raise StorageError(f"tile {key} is stored but its notification queue {arn} does not exist")
            self._urls[arn] = url
        self.queues.send(self._urls[arn], [s3_created_event(self.name, key, size, self.clock())])

    def _read(self, key: str, max_bytes: int | None) -> tuple[bytes, TileHead] | None:
        """The tile's head and (unless `max_bytes` is None) its bytes, refused by their size
        before they are read when over `max_bytes`; None when it is not there."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                header = f.readline(_MAX_HEADER)
                stat = os.fstat(f.fileno())
                head = TileHead(_parse_header(key, header), stat.st_size - len(header), stat.st_mtime)
                if max_bytes is not None and head.size > max_bytes:
                    raise PayloadTooLarge(f"tile {key} holds {head.size} bytes; its job's tiles hold at most "
                                          f"{max_bytes}")
                body = b"" if max_bytes is None else f.read(max_bytes + 1)
        except _MISSING:
            return None
        except OSError as exc:
            raise StorageError(f"local tile store {self.root}: cannot read tile {key}: {exc}") from exc
        return body, head

    def head(self, key: str) -> TileHead | None:
        """The tile's metadata, size and time stored, or None when it is not (or no longer) there."""
        found = self._read(key, None)
        return None if found is None else found[1]

    def metadata(self, key: str) -> dict[str, str] | None:
        """The tile's metadata, or None when it is not (or no longer) there."""
        head = self.head(key)
        return None if head is None else head.metadata

    def get_many_with_metadata(self, keys: Sequence[str], max_bytes: int
                               ) -> Iterator[tuple[str, tuple[bytes, dict[str, str]] | None]]:
        """(key, (bytes, metadata)) per tile, one at a time, None where it is missing."""
        for key in keys:
            found = self._read(key, max_bytes)
            yield key, None if found is None else (found[0], found[1].metadata)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete tiles, and the folders that leaves empty; missing tiles are not an error."""
        paths = [(key, self._path(key)) for key in keys]  # every key checked before any is deleted
        for key, path in paths:
            try:
                path.unlink()
            except _MISSING:
                continue
            except OSError as exc:
                raise StorageError(f"local tile store {self.root}: cannot delete tile {key}: {exc}") from exc
            self._prune(path.parent)

    def _prune(self, folder: Path) -> None:
        """Remove empty folders up to (not including) the objects folder; a folder that is not
        empty, or that a concurrent put fills again, stays."""
        while folder != self._objects and self._objects in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent


def _parse_header(key: str, header: bytes) -> dict[str, str]:
    try:
        metadata: Any = json.loads(header)
    except ValueError:
        metadata = None
    if not (isinstance(metadata, dict) and header.endswith(b"\n")
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise DataCorrupt(f"tile {key} in the local tile store has no readable metadata line")
    return metadata
