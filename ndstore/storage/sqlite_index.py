"""SupercuboidIndex in a SQLite file: the persistent single-machine default of `ndstore up`.
WAL mode and a busy timeout let several web processes share it.

A file that is no SQLite database any more (overwritten, truncated) is found when the index is
made ready (every process's start, /healthz; `ndstore reindex` checks every page): it is moved
aside, kept for forensics as `<file>.corrupt-<UTC time>`, and an empty index begun in its place,
and `ensure_ready` says so, for the engine to mark the index stale (ndstore/engine/index_check.py)
until `ndstore reindex` rebuilds it. One process moves it (a lock file serialises them); every
connection notices a file replaced under it and opens the new one. Damage found later, by a
query, is a StorageError (503) naming the file and the fix. `SqliteFile` is that handling of a
file, shared with the label index (sqlite_label_index.py).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ndstore.core.errors import StorageError
from ndstore.core.keys import SupercuboidKey, VolumeKey

_SCHEMA = """CREATE TABLE IF NOT EXISTS supercuboids (
    volume TEXT NOT NULL, morton INTEGER NOT NULL, object_key TEXT NOT NULL,
    PRIMARY KEY (volume, morton)) WITHOUT ROWID"""
_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
T = TypeVar("T")


class _Damaged(sqlite3.DatabaseError):
    """PRAGMA quick_check found damaged pages."""


def damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite found the file itself bad (not busy, locked or out of room)."""
    return isinstance(exc, _Damaged) or (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _DAMAGED


class SqliteFile:
    """A SQLite file shared by processes: a connection per thread, opened again when the file is
    replaced; a damaged file set aside by `ensure_ready`. A subclass names its schema, a table
    that a check reads, and what it is, for messages."""

    schema: tuple[str, ...]
    probe: str  # a table of the schema
    what: str
    repair: str  # the command that sets a damaged file aside and rebuilds what it held

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            for statement in self.schema:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, opened again when the file was replaced (set aside by
        another process) since it was opened."""
        local, inode = self._local, _inode(self.path)  # before opening: a swap in between opens again
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.inode == inode:
            return conn
        self._forget()
        conn = self._open()
        local.conn, local.inode = conn, inode if inode is not None else _inode(self.path)
        return conn

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return work(self._conn())
        except sqlite3.DatabaseError as exc:
            hint = f"; {self.repair} sets a damaged index aside and rebuilds it" if damaged(exc) else ""
            raise StorageError(f"{self.what} {self.path} cannot be used: {exc}{hint}") from exc

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """Create the file if it is missing. A file SQLite cannot read (with ``thorough``: any page
        of it, checked in full) is set aside and an empty index begun: returns what was found
        and where the file went; None when it was sound."""
        try:
            self._check(thorough)
            return None
        except sqlite3.DatabaseError as exc:
            if not damaged(exc):
                raise StorageError(f"{self.what} {self.path} cannot be opened: {exc}") from exc
            return self._set_aside(exc, thorough)

    def _check(self, thorough: bool) -> None:
        conn = self._conn()
        conn.execute(f"SELECT 1 FROM {self.probe} LIMIT 1").fetchall()  # a file changed under an open connection
        # Pages past the end of the file that the WAL cannot hold either: cut short. (Measured
        # after the page count: files only grow meanwhile, so a sound index is never suspected.)
        [(pages,)], [(page_size,)] = conn.execute("PRAGMA page_count"), conn.execute("PRAGMA page_size")
        held = _size(self.path) + _size(Path(f"{self.path}-wal"))
        if pages * page_size > held:
            raise _Damaged(f"database disk image is malformed: it is {pages * page_size} bytes long and its files "
                           f"hold {held} (truncated)")
        if thorough:
            verdict = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
            if verdict != ["ok"]:
                raise _Damaged(f"database disk image is malformed: {'; '.join(verdict)}")

    def _set_aside(self, exc: sqlite3.DatabaseError, thorough: bool) -> str | None:
        """Move the damaged file (and its WAL) aside under a lock file, unless another process did
        so first (the file there now is sound); then begin an empty index."""
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._forget()
            try:
                self._check(thorough)
                return None  # another process set it aside and began a sound one
            except sqlite3.DatabaseError as again:
                self._forget()
                if not damaged(again):
                    raise StorageError(f"{self.what} {self.path} cannot be opened: {again}") from again
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            aside = _unused(self.path.with_name(f"{self.path.name}.corrupt-{stamp}"))
            for suffix in ("", "-wal", "-shm"):
                if Path(f"{self.path}{suffix}").exists():
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
            self._conn()
        return f"{self.what} {self.path} is damaged ({exc}); it was moved aside to {aside}"

    def _forget(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None


class SqliteSupercuboidIndex(SqliteFile):
    schema = (_SCHEMA,)
    probe = "supercuboids"
    what = "the supercuboid index"
    repair = "`ndstore reindex`"

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        rows = [(k.volume.partition, k.morton, k.object_key) for k in keys]

        def put(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany("INSERT OR REPLACE INTO supercuboids VALUES (?, ?, ?)", rows)

        self._run(put)

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        rows = [(k.volume.partition, k.morton) for k in keys]

        def delete(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany("DELETE FROM supercuboids WHERE volume = ? AND morton = ?", rows)

        self._run(delete)

    def mortons(self, volume: VolumeKey) -> list[int]:
        return self._run(lambda conn: [row[0] for row in conn.execute(
            "SELECT morton FROM supercuboids WHERE volume = ? ORDER BY morton", (volume.partition,))])

    def volumes(self, prefix: str) -> list[VolumeKey]:
        # a range of the primary key, not LIKE: it walks only the prefix's rows
        above = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"
        rows = self._run(lambda conn: conn.execute(
            "SELECT DISTINCT volume FROM supercuboids WHERE volume >= ? AND volume < ?", (prefix, above)).fetchall())
        return sorted(VolumeKey.parse_partition(row[0]) for row in rows)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``...: the first name no file has (a copy kept is never overwritten)."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}-{n}")
    return free
