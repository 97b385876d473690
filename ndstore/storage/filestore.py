"""ObjectStore on a local directory: the persistent single-machine default of `ndstore up`.

Each object is one file, written to a temporary name, fsynced and renamed, so a reader sees
the old object or the new one, never a torn one, and a power cut keeps what was acknowledged.
A full disk is StorageFull (507), a read-only or failing one StorageError (503): callers retry,
and nothing half written stays behind.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ndstore.core.errors import StorageError, StorageFull
from ndstore.core.parallel import map_completed, run_all


class FileObjectStore:
    def __init__(self, root: str | os.PathLike[str], parallelism: int = 8, fsync: bool = True):
        self.root = Path(root)
        self.fsync = fsync
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="files")

    def ensure_ready(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/") or "\0" in key:
            raise ValueError(f"object key {key!r} is not a safe relative path")
        return self.root / key[:2] / key

    def get_many(self, keys: Sequence[str], window: int | None = None) -> Iterator[tuple[str, bytes | None]]:
        return map_completed(self._pool, self._get, keys, window)

    def _get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._failure("read", key, exc) from exc

    def put_many(self, items: Mapping[str, bytes]) -> None:
        run_all(self._pool, lambda k: self._put(k, items[k]), items)

    def _put(self, key: str, data: bytes) -> None:
        try:
            self._write(key, data)
        except OSError as exc:
            raise self._failure("write", key, exc) from exc

    def _failure(self, action: str, key: str, exc: OSError) -> StorageError:
        what = f"the object store at {self.root} could not {action} {key}: {exc.strerror or exc}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StorageFull(f"{what}; it is full: nothing was stored, retry once there is room")
        if exc.errno == errno.EROFS:
            return StorageError(f"{what}; it is read-only: retry once it is writable")
        return StorageError(what)

    def _write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink(missing_ok=True)
            except OSError as exc:
                raise self._failure("delete", key, exc) from exc

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        for path in self.root.glob("*/*"):
            if not path.name.startswith(".tmp-") and path.name.startswith(prefix):
                yield path.name
