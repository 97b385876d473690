"""SupercuboidIndex in a SQLite file: the persistent single-machine default of `ndstore up`.
WAL mode and a busy timeout let several web processes share it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from ndstore.core.keys import SupercuboidKey, VolumeKey

_SCHEMA = """CREATE TABLE IF NOT EXISTS supercuboids (
    volume TEXT NOT NULL, morton INTEGER NOT NULL, object_key TEXT NOT NULL,
    PRIMARY KEY (volume, morton)) WITHOUT ROWID"""


class SqliteSupercuboidIndex:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    def ensure_ready(self) -> None:
        self._conn().execute(_SCHEMA)

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        rows = [(k.volume.partition, k.morton, k.object_key) for k in keys]
        with self._conn() as conn:
            conn.executemany("INSERT OR REPLACE INTO supercuboids VALUES (?, ?, ?)", rows)

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        rows = [(k.volume.partition, k.morton) for k in keys]
        with self._conn() as conn:
            conn.executemany("DELETE FROM supercuboids WHERE volume = ? AND morton = ?", rows)

    def mortons(self, volume: VolumeKey) -> list[int]:
        cur = self._conn().execute(
            "SELECT morton FROM supercuboids WHERE volume = ? ORDER BY morton", (volume.partition,)
        )
        return [row[0] for row in cur]

    def volumes(self, prefix: str) -> list[VolumeKey]:
        # a range of the primary key, not LIKE: it walks only the prefix's rows
        if not prefix:
            rows = self._conn().execute("SELECT DISTINCT volume FROM supercuboids ORDER BY volume")
        else:
            above = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            rows = self._conn().execute("SELECT DISTINCT volume FROM supercuboids WHERE volume >= ? AND volume < ? "
                                        "ORDER BY volume", (prefix, above))
        return sorted(VolumeKey.parse_partition(row[0]) for row in rows)
