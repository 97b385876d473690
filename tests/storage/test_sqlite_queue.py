"""What only the SQLite queues promise (their WorkQueue contract runs in tests/contracts/):
oldest first, their own clock, stale receipts, errors as StorageErrors, many processes on one
file, data that outlives the object, and a deleted queue's messages purged a batch at a time."""

from __future__ import annotations

import json
import multiprocessing
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ndstore.core.errors import StorageError
from ndstore.storage.interfaces import Message, QueueCounts
from ndstore.storage.sqlite_queue import SqliteQueues


def test_sqlite_hands_out_the_longest_visible_first(tmp_path: Path) -> None:
    now = [1000.0]
    q = SqliteQueues(tmp_path / "queues.sqlite3", clock=lambda: now[0])
    url = q.create("order", visibility_s=300, max_receives=3)
    q.send(url, [f"m{i:02}" for i in range(25)])
    first = q.receive(url, 50, wait_s=0)
    assert [m.body for m in first] == [f"m{i:02}" for i in range(10)]
    now[0] += 1
    q.retry_later(first[3], 0)  # visible again, behind those visible since the send
    assert [m.body for m in q.receive(url, 3, wait_s=0)] == ["m10", "m11", "m12"]
    now[0] += 299  # the first lease ran out: those nine are visible now, behind m13.. and m03
    assert [m.body for m in q.peek(url, 100)] == [*(f"m{i:02}" for i in range(13, 25)), "m03",
                                                  *(f"m{i:02}" for i in (0, 1, 2, 4, 5, 6, 7, 8, 9))]


def test_sqlite_follows_its_clock(tmp_path: Path) -> None:
    now = [1000.0]
    q = SqliteQueues(tmp_path / "queues.sqlite3", clock=lambda: now[0])
    url = q.create("clocked", visibility_s=60, max_receives=2)
    dlq = f"{url}-dlq"
    q.send(url, ["tick"])
    assert q.receive(url, 1, wait_s=0)[0].receive_count == 1
    now[0] += 59.9
    assert q.receive(url, 1, wait_s=0) == []
    now[0] += 0.1
    assert q.receive(url, 1, wait_s=0)[0].receive_count == 2
    now[0] += 60
    assert q.counts(url) == QueueCounts(1, 0)
    assert q.receive(url, 1, wait_s=0) == []
    assert (q.counts(url), q.counts(dlq)) == (QueueCounts(0, 0), QueueCounts(1, 0))
    assert q.receive(dlq, 1, wait_s=0)[0].receive_count == 1  # it starts afresh there


def test_sqlite_stale_receipts_change_nothing(tmp_path: Path) -> None:
    q = SqliteQueues(tmp_path / "queues.sqlite3")
    url = q.create("stale", visibility_s=300, max_receives=5)
    q.send(url, ["m"])
    [old] = q.receive(url, 1, wait_s=0)
    q.retry_later(old, 0)
    [new] = q.receive(url, 1, wait_s=0)
    q.delete_message(url, old.receipt)  # received again since: another receiver holds it now
    q.retry_later(old, 0)
    assert q.counts(url) == QueueCounts(0, 1)
    q.delete_message(url, "no-such-receipt")
    q.delete_message(url, new.receipt)
    assert q.counts(url) == QueueCounts(0, 0)


def test_sqlite_errors_are_storage_errors(tmp_path: Path) -> None:
    q = SqliteQueues(tmp_path / "queues.sqlite3")
    missing = "sqlite-queue://missing"
    for call in (lambda: q.send(missing, ["x"]), lambda: q.receive(missing, wait_s=0), lambda: q.counts(missing),
                 lambda: q.peek(missing), lambda: q.arn(missing), lambda: q.move_all(missing, missing + "2"),
                 lambda: q.retry_later(Message("x", "r", 1, missing), 0)):
        with pytest.raises(StorageError, match="missing"):
            call()
    q.delete_message(missing, "r")  # idempotent, as is delete
    q.delete("missing")
    url = q.create("there", visibility_s=30, max_receives=3)
    with pytest.raises(StorageError, match="missing"):
        q.move_all(url, missing)
    with pytest.raises(StorageError, match="not a SQLite queue URL"):
        q.counts("https://sqs.us-east-1.amazonaws.com/1/there")
    with pytest.raises(StorageError, match="nothing was sent"):
        q.send(url, ["fine", "x" * ((1 << 20) + 1)])
    assert q.counts(url) == QueueCounts(0, 0)
    with pytest.raises(StorageError, match="open failed"):
        SqliteQueues(tmp_path)  # a directory, not a database file


def test_sqlite_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "queues.sqlite3"
    q = SqliteQueues(path)
    url = q.create("durable", visibility_s=300, max_receives=3)
    q.send(url, ["a", "b", "c"])
    [held] = q.receive(url, 1, wait_s=0)
    again = SqliteQueues(path)
    assert again.url("durable") == url
    assert again.names("dur") == ["durable", "durable-dlq"]
    assert again.counts(url) == QueueCounts(2, 1)
    assert [m.body for m in again.receive(url, 10, wait_s=0)] == ["b", "c"]
    again.delete_message(url, held.receipt)  # the receipt of the first object holds in the second
    assert again.counts(url) == QueueCounts(0, 2)


def _receive_all(path: str, url: str, start: Any, out: str) -> None:
    """A worker process: once both are ready, receive (never delete) until the queue has nothing
    visible, then write what it got."""
    q, got, idle = SqliteQueues(Path(path)), [], 0
    start.wait(30)
    while idle < 3:
        batch = q.receive(url, random.randint(1, 10), wait_s=0, visibility_s=300)
        got += [m.body for m in batch]
        idle = 0 if batch else idle + 1
        time.sleep(0.02)  # as a worker handling its tasks would: the other one, in SQLite's busy wait, gets turns
    Path(out).write_text(json.dumps(got))


def test_sqlite_two_processes_never_share_a_hidden_message(tmp_path: Path) -> None:
    path = tmp_path / "queues.sqlite3"
    q = SqliteQueues(path)
    url = q.create("shared", visibility_s=300, max_receives=3)
    bodies = [f"task-{i}" for i in range(200)]
    q.send(url, bodies)
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    procs = [context.Process(target=_receive_all, args=(str(path), url, start, str(out))) for out in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = [json.loads(out.read_text()) for out in outs]
    assert all(got), "both workers received some"
    everything = got[0] + got[1]
    assert len(everything) == len(set(everything)) == 200
    assert set(everything) == set(bodies)
    assert q.counts(url) == QueueCounts(0, 200)


def test_sqlite_a_deleted_queue_goes_at_once_and_its_messages_a_batch_at_a_time(tmp_path: Path) -> None:
    from ndstore.storage import sqlite_queue

    q = SqliteQueues(tmp_path / "queues.sqlite3")
    url, other = q.create("big", visibility_s=300, max_receives=3), q.create("other", visibility_s=300, max_receives=3)
    q.send(url, [f"m{i}" for i in range(2500)])
    q.delete("big")
    assert q.url("big") is None and q.names("big") == []

    def left() -> int:
        with sqlite3.connect(q.path) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM messages WHERE queue = 'big'").fetchone()[0])

    assert left() == 2500 - sqlite_queue.PURGE_BATCH  # one batch went with the delete
    q.send(other, ["x"])  # and one with each change that follows
    assert left() == 2500 - 2 * sqlite_queue.PURGE_BATCH
    again = q.create("big", visibility_s=300, max_receives=3)  # a name made again starts empty
    assert left() == 0 and q.counts(again) == QueueCounts(0, 0) and q.receive(again, 10, wait_s=0) == []
    assert q.counts(other) == QueueCounts(1, 0)
