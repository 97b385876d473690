"""JobState in a SQLite file: the local stack's record of ingest jobs and downsample runs (what
DynamoJobState keeps in DynamoDB on AWS), with the same rows, numbers, flags and conditions.

A row is a key with four kinds of attributes, one table each: numbers (counters, `expected`,
`manifest_sent`, any `set_count` name), flags (set once to True: queued, built, cleaned, ...),
strings (`claim`, `spec`) and the set of arrived tile ordinals. Many processes share the file:
WAL mode, a 30 s busy timeout, a short-lived connection per call (never shared between
threads), and `BEGIN IMMEDIATE` around every read-modify-write, so a condition and the change
it guards (a tile and its count, a flag and its count) are one transaction: a duplicate event
or a retried handler never counts twice.
"""

from __future__ import annotations

import re
import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ndstore.core.errors import StorageError

COUNTERS = ("tiles_uploaded", "supercuboids_built", "supercuboids_cleaned")
FLAGS = ("queued", "built", "cleaned")
BUSY_TIMEOUT_S = 30.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS numbers (key TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, "
    "PRIMARY KEY (key, name)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS flags (key TEXT NOT NULL, name TEXT NOT NULL, "
    "PRIMARY KEY (key, name)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS strings (key TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, "
    "PRIMARY KEY (key, name)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS tiles (key TEXT NOT NULL, ordinal INTEGER NOT NULL, "
    "PRIMARY KEY (key, ordinal)) WITHOUT ROWID",
)
_TABLES = ("numbers", "flags", "strings", "tiles")
_ADD_ONE = ("INSERT INTO numbers (key, name, value) VALUES (?, ?, 1) "
            "ON CONFLICT (key, name) DO UPDATE SET value = value + 1")
_SET_NUMBER = ("INSERT INTO numbers (key, name, value) VALUES (?, ?, ?) "
               "ON CONFLICT (key, name) DO UPDATE SET value = excluded.value")
_SET_STRING = ("INSERT INTO strings (key, name, value) VALUES (?, ?, ?) "
               "ON CONFLICT (key, name) DO UPDATE SET value = excluded.value")
_SET_FLAG = "INSERT OR IGNORE INTO flags (key, name) VALUES (?, ?)"
UPLOADER = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _leave_name(uploader: str) -> str:
    if not UPLOADER.fullmatch(uploader):
        raise StorageError(f"SQLite job state: {uploader!r:.80} is not an uploader's name")
    return f"leave:{uploader}"


class SqliteJobState:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ensure_ready()

    # -- connections and transactions -------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _tx(self, call: str, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One connection and one transaction (IMMEDIATE: the write lock is taken before the
        first read, so a condition cannot go stale before its change); sqlite3 errors become
        StorageError naming the call."""
        try:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite job state {self.path}: {call} failed: {exc}") from exc

    def ensure_ready(self) -> None:
        """Create the file, its folder and the schema if missing; idempotent."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"SQLite job state {self.path}: ensure_ready failed: {exc}") from exc
        try:
            conn = self._connect()
            try:
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: recorded in the file
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite job state {self.path}: ensure_ready failed: {exc}") from exc
        with self._tx("ensure_ready") as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    # -- reads ------------------------------------------------------------------------------------
    @staticmethod
    def _exists(conn: sqlite3.Connection, table: str, key: str, column: str, value: object) -> bool:
        sql = f"SELECT 1 FROM {table} WHERE key = ? AND {column} = ?"
        return conn.execute(sql, (key, value)).fetchone() is not None

    @staticmethod
    def _numbers(conn: sqlite3.Connection, key: str) -> dict[str, int]:
        return {name: int(value) for name, value in
                conn.execute("SELECT name, value FROM numbers WHERE key = ?", (key,))}

    @staticmethod
    def _string(conn: sqlite3.Connection, key: str, name: str) -> str | None:
        row = conn.execute("SELECT value FROM strings WHERE key = ? AND name = ?", (key, name)).fetchone()
        return None if row is None else str(row[0])

    # -- tiles ------------------------------------------------------------------------------------
    def record_tile(self, job: str, row: str, ordinal: int, expected: int) -> bool:
        """Add a tile to its row and count it on the job; False (nothing changed) when it was
        there already or the row was cleaned (a late duplicate event)."""
        with self._tx("record_tile") as conn:
            if (self._exists(conn, "flags", row, "name", "cleaned")
                    or self._exists(conn, "tiles", row, "ordinal", ordinal)):
                return False
            conn.execute("INSERT INTO tiles (key, ordinal) VALUES (?, ?)", (row, ordinal))
            conn.execute(_SET_NUMBER, (row, "expected", expected))
            conn.execute(_ADD_ONE, (job, "tiles_uploaded"))
            return True

    def supercuboid(self, row: str) -> dict[str, Any]:
        """The row as plain values: tiles (set of ordinals), expected, claim, queued, built, cleaned."""
        with self._tx("supercuboid", write=False) as conn:
            tiles = {int(o) for (o,) in conn.execute("SELECT ordinal FROM tiles WHERE key = ?", (row,))}
            flags = {str(n) for (n,) in conn.execute("SELECT name FROM flags WHERE key = ?", (row,))}
            expected = self._numbers(conn, row).get("expected", 0)
            claim = self._string(conn, row, "claim")
        return {"tiles": tiles, "expected": expected, "claim": claim, **{flag: flag in flags for flag in FLAGS}}

    def has_tile(self, row: str, ordinal: int) -> bool:
        with self._tx("has_tile", write=False) as conn:
            return (self._exists(conn, "tiles", row, "ordinal", ordinal)
                    or self._exists(conn, "flags", row, "name", "cleaned"))

    # -- a row's way through the pipeline ---------------------------------------------------------
    def claim(self, row: str, claimant: str) -> bool:
        """Take the row for `claimant`: True if it was free or theirs already (a retry)."""
        with self._tx("claim") as conn:
            holder = self._string(conn, row, "claim")
            if holder is not None and holder != claimant:
                return False
            conn.execute(_SET_STRING, (row, "claim", claimant))
            return True

    def mark(self, row: str, flag: str) -> None:
        with self._tx("mark") as conn:
            conn.execute(_SET_FLAG, (row, flag))

    def mark_counted(self, job: str, row: str, flag: str, counter: str, drop_tiles: bool = False) -> bool:
        """Set a flag once and count it on the job (with `drop_tiles`, forget the row's tile
        set too); False (nothing changed) when the flag was set before."""
        with self._tx("mark_counted") as conn:
            if self._exists(conn, "flags", row, "name", flag):
                return False
            conn.execute(_SET_FLAG, (row, flag))
            if drop_tiles:
                conn.execute("DELETE FROM tiles WHERE key = ?", (row,))
            conn.execute(_ADD_ONE, (job, counter))
            return True

    def set_count(self, key: str, name: str, value: int) -> None:
        with self._tx("set_count") as conn:
            conn.execute(_SET_NUMBER, (key, name, value))

    def counters(self, key: str) -> dict[str, int]:
        """Every number of a row."""
        with self._tx("counters", write=False) as conn:
            return self._numbers(conn, key)

    # -- jobs -------------------------------------------------------------------------------------
    def job(self, job: str) -> dict[str, int]:
        """The job's counters and manifest_sent, 0 where unset."""
        numbers = self.counters(job)
        return {name: numbers.get(name, 0) for name in (*COUNTERS, "manifest_sent")}

    def put_job(self, job: str, spec: str) -> None:
        with self._tx("put_job") as conn:
            conn.execute(_SET_STRING, (job, "spec", spec))

    def job_spec(self, job: str) -> str | None:
        with self._tx("job_spec", write=False) as conn:
            return self._string(conn, job, "spec")

    def advance_manifest(self, job: str, sent: int, to: int) -> bool:
        """Set manifest_sent to `to` if it is `sent` (or unset when `sent` is 0); False: another
        caller recorded that chunk first."""
        with self._tx("advance_manifest") as conn:
            current = self._numbers(conn, job).get("manifest_sent")
            if current != sent and not (current is None and sent == 0):
                return False
            conn.execute(_SET_NUMBER, (job, "manifest_sent", to))
            return True

    # -- leaves to upload ---------------------------------------------------------------------------
    def open_leave(self, job: str, uploader: str) -> str | None:
        """The uploader's leave (made on the first call); None once the job is stopped."""
        name = _leave_name(uploader)
        with self._tx("open_leave") as conn:
            if self._exists(conn, "flags", job, "name", "stopped"):
                return None
            leave = self._string(conn, job, name)
            if leave is None:
                leave = secrets.token_hex(12)
                conn.execute(_SET_STRING, (job, name, leave))
            return leave

    def leaves(self, job: str) -> dict[str, str] | None:
        with self._tx("leaves", write=False) as conn:
            if self._exists(conn, "flags", job, "name", "stopped") or self._string(conn, job, "spec") is None:
                return None
            rows = conn.execute("SELECT name, value FROM strings WHERE key = ? AND substr(name, 1, 6) = 'leave:'",
                                (job,))
            return {str(name)[6:]: str(value) for name, value in rows}

    def revoke_leave(self, job: str, uploader: str) -> None:
        with self._tx("revoke_leave") as conn:
            conn.execute("DELETE FROM strings WHERE key = ? AND name = ?", (job, _leave_name(uploader)))

    def stop(self, job: str) -> None:
        with self._tx("stop") as conn:
            conn.execute(_SET_FLAG, (job, "stopped"))

    def delete(self, keys: Sequence[str]) -> None:
        """Delete rows, every attribute of each; missing rows are not an error."""
        with self._tx("delete") as conn:
            for table in _TABLES:
                conn.executemany(f"DELETE FROM {table} WHERE key = ?", [(k,) for k in keys])
