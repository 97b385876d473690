"""LabelIndex in a SQLite file next to the supercuboid index: the single-machine default.

One table of entries (volume, label, morton, voxels), keyed by label first (a label's
supercuboids: one range) with a second index by supercuboid (a supercuboid's labels); a table of
unsettled marks; a table of the channels served. `begin` and `settle` are one transaction each.
SQLite's integers are signed 64-bit: a label is stored less 2^63, which keeps its order and
fits every uint64. A damaged file is set aside as the supercuboid index's is (SqliteFile); an
empty label index serves no channel, so the data plane scans voxels until `ndstore reindex
--labels` rebuilds it.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence

from ndstore.core.keys import SEPARATOR, SupercuboidKey, VolumeKey
from ndstore.storage.sqlite_index import SqliteFile

SHIFT = 1 << 63  # uint64 label - SHIFT: an int64 in the same order
IN_BATCH = 500  # Morton codes per IN (...) of a lookup (SQLite allows 32766 parameters)


def _stored(label: int) -> int:
    return label - SHIFT


def _label(stored: int) -> int:
    return stored + SHIFT


class SqliteLabelIndex(SqliteFile):
    schema = (
        """CREATE TABLE IF NOT EXISTS labels (
            volume TEXT NOT NULL, label INTEGER NOT NULL, morton INTEGER NOT NULL, voxels INTEGER NOT NULL,
            PRIMARY KEY (volume, label, morton)) WITHOUT ROWID""",
        "CREATE INDEX IF NOT EXISTS labels_by_supercuboid ON labels (volume, morton)",
        """CREATE TABLE IF NOT EXISTS unsettled (
            volume TEXT NOT NULL, morton INTEGER NOT NULL, why TEXT NOT NULL,
            PRIMARY KEY (volume, morton)) WITHOUT ROWID""",
        """CREATE TABLE IF NOT EXISTS channels (
            prefix TEXT NOT NULL PRIMARY KEY, complete INTEGER NOT NULL) WITHOUT ROWID""",
    )
    probe = "labels"
    what = "the label index"
    repair = "`ndstore reindex --labels`"

    def register(self, prefixes: Sequence[str], complete: bool) -> list[str]:
        def add(conn: sqlite3.Connection) -> list[str]:
            with conn:
                new = [p for p in dict.fromkeys(prefixes)
                       if conn.execute("SELECT 1 FROM channels WHERE prefix = ?", (p,)).fetchone() is None]
                conn.executemany("INSERT INTO channels VALUES (?, ?)", [(p, int(complete)) for p in new])
            return new

        return self._run(add)

    def set_complete(self, prefixes: Sequence[str]) -> None:
        def mark(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany("UPDATE channels SET complete = 1 WHERE prefix = ?", [(p,) for p in prefixes])

        self._run(mark)

    def channel(self, prefix: str) -> bool | None:
        row = self._run(lambda conn: conn.execute("SELECT complete FROM channels WHERE prefix = ?",
                                                  (prefix,)).fetchone())
        return None if row is None else bool(row[0])

    def begin(self, counts: Mapping[SupercuboidKey, Mapping[int, int]], why: str) -> None:
        marks = [(k.volume.partition, k.morton, why) for k in counts]
        rows = [(volume, _stored(label), morton, voxels) for (volume, morton, _), found in zip(marks, counts.values())
                for label, voxels in found.items()]

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany("INSERT OR REPLACE INTO unsettled VALUES (?, ?, ?)", marks)
                conn.executemany("INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?)", rows)

        self._run(write)

    def settle(self, drops: Mapping[SupercuboidKey, Collection[int]], unmark: bool = True) -> None:
        keys = [(k.volume.partition, k.morton) for k in drops]
        rows = [(volume, _stored(label), morton) for (volume, morton), labels in zip(keys, drops.values())
                for label in labels]
        marks = keys if unmark else []

        def write(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany("DELETE FROM labels WHERE volume = ? AND label = ? AND morton = ?", rows)
                conn.executemany("DELETE FROM unsettled WHERE volume = ? AND morton = ?", marks)

        self._run(write)

    def labels_of(self, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, dict[int, int]]:
        out: dict[SupercuboidKey, dict[int, int]] = {k: {} for k in keys}
        by_volume: dict[VolumeKey, dict[int, dict[int, int]]] = defaultdict(dict)
        for key, found in out.items():
            by_volume[key.volume][key.morton] = found

        def read(conn: sqlite3.Connection) -> None:
            for volume, by_morton in by_volume.items():
                mortons = list(by_morton)
                for i in range(0, len(mortons), IN_BATCH):
                    batch = mortons[i : i + IN_BATCH]
                    for morton, label, voxels in conn.execute(
                            f"SELECT morton, label, voxels FROM labels WHERE volume = ? AND morton IN "
                            f"({', '.join('?' * len(batch))})", (volume.partition, *batch)):
                        by_morton[morton][_label(label)] = voxels

        self._run(read)
        return out

    def supercuboids_of(self, volume: VolumeKey, label: int) -> dict[int, int]:
        return dict(self._run(lambda conn: conn.execute(
            "SELECT morton, voxels FROM labels WHERE volume = ? AND label = ?",
            (volume.partition, _stored(label))).fetchall()))

    def unsettled(self, volume: VolumeKey) -> dict[int, str]:
        return dict(self._run(lambda conn: conn.execute(
            "SELECT morton, why FROM unsettled WHERE volume = ?", (volume.partition,)).fetchall()))

    def indexed(self, prefix: str) -> list[SupercuboidKey]:
        # a range of volumes that holds every name under the prefix (a volume's own prefix ends
        # in the separator its partition lacks), then the names themselves checked
        low = prefix.removesuffix(SEPARATOR)
        high = low[:-1] + chr(ord(low[-1]) + 1) if low else "\U0010ffff"
        rows = self._run(lambda conn: conn.execute(
            "SELECT DISTINCT volume, morton FROM labels WHERE volume >= ?1 AND volume < ?2 "
            "UNION SELECT volume, morton FROM unsettled WHERE volume >= ?1 AND volume < ?2", (low, high)).fetchall())
        keys = (VolumeKey.parse_partition(volume).supercuboid(morton) for volume, morton in rows)
        return sorted(k for k in keys if k.name.startswith(prefix))
