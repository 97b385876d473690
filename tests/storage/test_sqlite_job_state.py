"""What only the SQLite job state promises (its JobState contract runs in tests/contracts/): its
folder made, data that outlives the object, errors as StorageErrors with the failed transaction
rolled back, and one file shared by many threads and processes at once."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from ndstore.core.errors import StorageError
from ndstore.storage.sqlite_job_state import SqliteJobState

JOB, ROW = "7", "7&0&12"


def test_sqlite_creates_its_folder_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "state.sqlite3"
    first = SqliteJobState(path)
    first.record_tile(JOB, ROW, 1, 2)
    again = SqliteJobState(path)
    again.ensure_ready()
    assert again.supercuboid(ROW)["tiles"] == {1}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_errors_are_storage_errors_naming_the_call(tmp_path: Path) -> None:
    s = SqliteJobState(tmp_path / "state.sqlite3")
    with sqlite3.connect(tmp_path / "state.sqlite3") as conn:
        conn.execute("DROP TABLE tiles")
    with pytest.raises(StorageError, match="record_tile"):
        s.record_tile(JOB, ROW, 0, 1)
    assert s.counters(JOB) == {}  # the failed transaction was rolled back


def _record_all(path: str, seed: int, threads: int, start: Any) -> None:
    """Record ordinals 0..49 (10 rows of 5) from `threads` threads, each in its own order, all
    starting when every thread of every process waits at the `start` barrier."""
    state = SqliteJobState(Path(path))
    errors: list[BaseException] = []

    def record(n: int) -> None:
        ordinals = list(range(50))
        random.Random(seed * 100 + n).shuffle(ordinals)
        try:
            start.wait(60)
            for o in ordinals:
                state.record_tile(JOB, f"7&0&{o // 5}", o, 5)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            errors.append(exc)

    workers = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def test_sqlite_counts_each_tile_once_under_concurrent_threads_and_processes(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    SqliteJobState(path)
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2 * 4 + 6)
    procs = [context.Process(target=_record_all, args=(str(path), seed, 4, start)) for seed in (1, 2)]
    for p in procs:
        p.start()
    _record_all(str(path), 3, 6, start)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = SqliteJobState(path)
    assert state.job(JOB)["tiles_uploaded"] == 50
    assert set().union(*(state.supercuboid(f"7&0&{r}")["tiles"] for r in range(10))) == set(range(50))
