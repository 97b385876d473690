"""The WorkQueue port's contract, written once and run against both implementations: SQS over
real HTTP (moto's server) and the SQLite file. Then what only the SQLite queues promise: oldest
first, many processes on one file, and data that outlives the object."""

from __future__ import annotations

import json
import multiprocessing
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ndstore.core.errors import StorageError
from ndstore.storage.interfaces import Message, QueueCounts, WorkQueue
from ndstore.storage.sqlite_queue import SqliteQueues
from ndstore.storage.sqs import SqsQueues

DEADLINE_S = 8.0


@pytest.fixture(params=["sqs", "sqlite"])
def queues(request: pytest.FixtureRequest, tmp_path: Path) -> WorkQueue:
    if request.param == "sqs":
        return SqsQueues(request.getfixturevalue("moto_endpoint"))
    return SqliteQueues(tmp_path / "queues.sqlite3")


@pytest.fixture
def prefix() -> str:
    return f"q{uuid.uuid4().hex[:12]}"


def eventually(check: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    """Poll `check` until it holds (moto's clock has millisecond steps; SQS counts are approximate)."""
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.02)


def receive_n(q: WorkQueue, url: str, n: int, **kwargs: int) -> list[Message]:
    """Receive until `n` messages came (SQS may hand out fewer than asked per call)."""
    got: list[Message] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} messages in time"
        got += q.receive(url, n - len(got), wait_s=1, **kwargs)
    assert len(got) == n
    return got


# -- the contract -----------------------------------------------------------------------------


def test_send_receive_delete_round_trip(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=30, max_receives=3)
    bodies = [json.dumps({"n": i}) for i in range(5)]
    assert queues.send(url, bodies) == 5
    got = receive_n(queues, url, 5)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert {m.receive_count for m in got} == {1}
    assert {m.queue_url for m in got} == {url}
    assert len({m.receipt for m in got}) == 5
    assert sorted(m.json()["n"] for m in got) == list(range(5))
    assert queues.counts(url) == QueueCounts(0, 5)
    for m in got:
        queues.delete_message(url, m.receipt)
    assert queues.counts(url) == QueueCounts(0, 0)
    assert queues.receive(url, 10, wait_s=0) == []


def test_receive_hands_out_at_most_ten(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=30, max_receives=3)
    queues.send(url, [f"m{i}" for i in range(25)])
    assert 1 <= len(queues.receive(url, 50, wait_s=1)) <= 10


def test_hidden_until_the_visibility_timeout_then_delivered_again(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=1, max_receives=5)
    queues.send(url, ["once"])
    [first] = receive_n(queues, url, 1)
    assert first.receive_count == 1
    assert queues.receive(url, 10, wait_s=0) == []  # hidden
    assert queues.counts(url) == QueueCounts(0, 1)
    [again] = receive_n(queues, url, 1)  # within DEADLINE_S, once its second has passed
    assert (again.body, again.receive_count) == ("once", 2)
    assert again.receipt != first.receipt
    queues.delete_message(url, again.receipt)
    assert queues.counts(url) == QueueCounts(0, 0)


def test_receive_with_its_own_visibility(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=5)
    queues.send(url, ["short"])
    receive_n(queues, url, 1, visibility_s=1)
    [again] = receive_n(queues, url, 1)
    assert again.receive_count == 2


def test_retry_later_makes_it_visible(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=5)
    queues.send(url, ["retry me"])
    [m] = receive_n(queues, url, 1)
    queues.retry_later(m, 0)
    [again] = receive_n(queues, url, 1)
    assert (again.body, again.receive_count) == ("retry me", 2)
    queues.retry_later(again, 300)  # hidden again, for longer
    assert queues.counts(url) == QueueCounts(0, 1)
    assert queues.receive(url, 10, wait_s=0) == []


def test_dead_letter_queue_after_max_receives(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=2)
    dlq = queues.url(f"{prefix}-dlq")
    assert dlq is not None
    queues.send(url, ["poison"])
    for tries in (1, 2):
        [m] = receive_n(queues, url, 1)
        assert m.receive_count == tries
        queues.retry_later(m, 0)

    def redriven() -> bool:  # the next receive moves it instead of delivering it a third time
        assert queues.receive(url, 10, wait_s=0) == []
        return queues.counts(dlq) == QueueCounts(1, 0)

    eventually(redriven)
    assert queues.counts(url) == QueueCounts(0, 0)
    [dead] = receive_n(queues, dlq, 1)
    assert dead.body == "poison"


def test_counts_of_waiting_and_in_flight(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=3)
    assert queues.counts(url) == QueueCounts(0, 0)
    queues.send(url, ["a", "b", "c"])
    assert queues.counts(url) == QueueCounts(3, 0)
    receive_n(queues, url, 1)
    counts = queues.counts(url)
    assert counts == QueueCounts(2, 1)
    assert counts.total == 3


def test_peek_leaves_messages_in_place(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=5)
    queues.send(url, ["x", "y", "z"])
    seen = queues.peek(url, 10)
    assert sorted(m.body for m in seen) == ["x", "y", "z"]
    eventually(lambda: queues.counts(url) == QueueCounts(3, 0))
    assert len(queues.peek(url, 2)) == 2
    eventually(lambda: queues.counts(url) == QueueCounts(3, 0))
    got = receive_n(queues, url, 3)
    assert sorted(m.body for m in got) == ["x", "y", "z"]
    assert all(m.receive_count >= 2 for m in got)  # a look counts as a receive


def test_move_all_back_from_the_dead_letter_queue(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=300, max_receives=1)
    dlq = queues.url(f"{prefix}-dlq")
    assert dlq is not None
    queues.send(url, ["p", "q"])
    for m in receive_n(queues, url, 2):
        queues.retry_later(m, 0)
    eventually(lambda: queues.receive(url, 10, wait_s=0) == [] and queues.counts(dlq) == QueueCounts(2, 0))
    assert queues.move_all(dlq, url) == 2
    assert queues.counts(dlq) == QueueCounts(0, 0)
    assert queues.counts(url) == QueueCounts(2, 0)
    got = receive_n(queues, url, 2)
    assert sorted(m.body for m in got) == ["p", "q"]
    assert {m.receive_count for m in got} == {1}  # a fresh start
    assert queues.move_all(dlq, url) == 0


def test_create_is_idempotent_and_keeps_messages(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=30, max_receives=3)
    queues.send(url, ["kept"])
    assert queues.create(prefix, visibility_s=30, max_receives=3) == url
    assert queues.url(prefix) == url
    assert queues.counts(url) == QueueCounts(1, 0)
    with pytest.raises(StorageError):  # SQS refuses the same name with other attributes
        queues.create(prefix, visibility_s=31, max_receives=3)


def test_url_arn_names_and_delete(queues: WorkQueue, prefix: str) -> None:
    assert queues.url(f"{prefix}-a") is None
    assert queues.names(prefix) == []
    a = queues.create(f"{prefix}-a", visibility_s=30, max_receives=3)
    queues.create(f"{prefix}-b", visibility_s=30, max_receives=3)
    assert queues.url(f"{prefix}-a") == a
    assert queues.arn(a).rsplit(":", 1)[1] == f"{prefix}-a"
    assert queues.names(prefix) == [f"{prefix}-a", f"{prefix}-a-dlq", f"{prefix}-b", f"{prefix}-b-dlq"]
    assert queues.names(f"{prefix}-a") == [f"{prefix}-a", f"{prefix}-a-dlq"]
    queues.send(a, ["gone with it"])
    queues.delete(f"{prefix}-a")
    assert queues.url(f"{prefix}-a") is None
    assert queues.url(f"{prefix}-a-dlq") is None
    assert queues.names(prefix) == [f"{prefix}-b", f"{prefix}-b-dlq"]
    queues.delete(f"{prefix}-a")  # idempotent


def test_delete_message_twice_is_harmless(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=30, max_receives=3)
    queues.send(url, ["one", "two"])
    [m, other] = receive_n(queues, url, 2)
    queues.delete_message(url, m.receipt)
    queues.delete_message(url, m.receipt)
    assert queues.counts(url) == QueueCounts(0, 1)
    queues.delete_message(url, other.receipt)
    assert queues.counts(url) == QueueCounts(0, 0)


def test_a_missing_queue_is_a_storage_error(queues: WorkQueue, prefix: str) -> None:
    url = queues.create(prefix, visibility_s=30, max_receives=3)
    queues.delete(prefix)
    for call in (lambda: queues.send(url, ["x"]), lambda: queues.receive(url, 1, wait_s=0),
                 lambda: queues.counts(url), lambda: queues.peek(url), lambda: queues.arn(url)):
        with pytest.raises(StorageError):
            call()


# -- what only the SQLite queues promise -------------------------------------------------------


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
