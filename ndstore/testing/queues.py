"""The WorkQueue port's contract: named queues of text tasks with SQS's semantics (at least once
delivery, a visibility timeout, a dead-letter queue after `max_receives`).

A subclass defines the fixture `queues`: the implementation under test, on a backend where the
queues named by the `prefix` fixture (fresh for each test) do not exist yet.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest

from ndstore.core.errors import StorageError
from ndstore.storage.interfaces import Message, QueueCounts, WorkQueue

DEADLINE_S = 8.0


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


class WorkQueueContract:
    @pytest.fixture
    def queues(self) -> WorkQueue:
        raise NotImplementedError("a subclass defines the `queues` fixture")

    @pytest.fixture
    def prefix(self) -> str:
        return f"q{uuid.uuid4().hex[:12]}"


    def test_send_receive_delete_round_trip(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_receive_hands_out_at_most_ten(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        queues.send(url, [f"m{i}" for i in range(25)])
        assert 1 <= len(queues.receive(url, 50, wait_s=1)) <= 10

    def test_hidden_until_the_visibility_timeout_then_delivered_again(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_receive_with_its_own_visibility(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=300, max_receives=5)
        queues.send(url, ["short"])
        receive_n(queues, url, 1, visibility_s=1)
        [again] = receive_n(queues, url, 1)
        assert again.receive_count == 2

    def test_retry_later_makes_it_visible(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=300, max_receives=5)
        queues.send(url, ["retry me"])
        [m] = receive_n(queues, url, 1)
        queues.retry_later(m, 0)
        [again] = receive_n(queues, url, 1)
        assert (again.body, again.receive_count) == ("retry me", 2)
        queues.retry_later(again, 300)  # hidden again, for longer
        assert queues.counts(url) == QueueCounts(0, 1)
        assert queues.receive(url, 10, wait_s=0) == []

    def test_dead_letter_queue_after_max_receives(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_counts_of_waiting_and_in_flight(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=300, max_receives=3)
        assert queues.counts(url) == QueueCounts(0, 0)
        queues.send(url, ["a", "b", "c"])
        assert queues.counts(url) == QueueCounts(3, 0)
        receive_n(queues, url, 1)
        counts = queues.counts(url)
        assert counts == QueueCounts(2, 1)
        assert counts.total == 3

    def test_peek_leaves_messages_in_place(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_move_all_back_from_the_dead_letter_queue(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_create_is_idempotent_and_keeps_messages(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        queues.send(url, ["kept"])
        assert queues.create(prefix, visibility_s=30, max_receives=3) == url
        assert queues.url(prefix) == url
        assert queues.counts(url) == QueueCounts(1, 0)
        with pytest.raises(StorageError):  # SQS refuses the same name with other attributes
            queues.create(prefix, visibility_s=31, max_receives=3)

    def test_url_arn_names_and_delete(self, queues: WorkQueue, prefix: str) -> None:
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

    def test_delete_message_twice_is_harmless(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        queues.send(url, ["one", "two"])
        [m, other] = receive_n(queues, url, 2)
        queues.delete_message(url, m.receipt)
        queues.delete_message(url, m.receipt)
        assert queues.counts(url) == QueueCounts(0, 1)
        queues.delete_message(url, other.receipt)
        assert queues.counts(url) == QueueCounts(0, 0)

    def test_a_missing_queue_is_a_storage_error(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        queues.delete(prefix)
        for call in (lambda: queues.send(url, ["x"]), lambda: queues.receive(url, 1, wait_s=0),
                     lambda: queues.counts(url), lambda: queues.peek(url), lambda: queues.arn(url)):
            with pytest.raises(StorageError):
                call()

    def test_sending_nothing_sends_nothing(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        assert queues.send(url, []) == 0
        assert queues.send(url, iter(())) == 0
        assert queues.counts(url) == QueueCounts(0, 0)

    def test_bodies_come_back_exactly(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=30, max_receives=3)
        bodies = ["ünïcödé ✓ 漢字", "lines\nand\r\ntabs\t ", json.dumps({"nested": [1, {"k": None}]}),
                  "x" * (200 << 10)]
        assert queues.send(url, (b for b in bodies)) == len(bodies)  # any iterable
        assert sorted(m.body for m in receive_n(queues, url, len(bodies))) == sorted(bodies)

    def test_peek_sees_past_one_receive(self, queues: WorkQueue, prefix: str) -> None:
        url = queues.create(prefix, visibility_s=300, max_receives=5)
        bodies = [f"dead-{i:02}" for i in range(25)]
        queues.send(url, bodies)
        assert sorted(m.body for m in queues.peek(url, 100)) == bodies
        eventually(lambda: queues.counts(url) == QueueCounts(25, 0))
        assert len(queues.peek(url, 12)) == 12

    def test_move_all_between_two_queues(self, queues: WorkQueue, prefix: str) -> None:
        source = queues.create(f"{prefix}-from", visibility_s=300, max_receives=3)
        target = queues.create(f"{prefix}-to", visibility_s=300, max_receives=3)
        bodies = [f"task-{i:02}" for i in range(15)]  # more than one receive's worth
        queues.send(source, bodies)
        queues.send(target, ["already there"])
        assert queues.move_all(source, target) == 15
        assert queues.counts(source) == QueueCounts(0, 0)
        assert queues.counts(target) == QueueCounts(16, 0)
        assert sorted(m.body for m in receive_n(queues, target, 16)) == sorted([*bodies, "already there"])
