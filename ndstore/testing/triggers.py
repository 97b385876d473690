"""The Triggers port's contract: a function run by a queue's messages, attached and detached.

A subclass defines the fixtures `triggers` (the implementation under test), `queue_arn` (a
factory: the ARN of a new queue each call) and `functions` (two functions a trigger may run, as
`attach` takes them), and the hook `attached`: the (function, batch size) of each trigger the
backend holds for a queue, read behind the port's back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ndstore.storage.interfaces import Triggers


class TriggersContract:
    @pytest.fixture
    def triggers(self) -> Triggers:
        raise NotImplementedError("a subclass defines the `triggers` fixture")

    @pytest.fixture
    def queue_arn(self) -> Callable[[], str]:
        raise NotImplementedError("a subclass defines `queue_arn`: a factory of new queues' ARNs")

    @pytest.fixture
    def functions(self) -> tuple[str, str]:
        raise NotImplementedError("a subclass defines `functions`: two functions a trigger may run")

    def attached(self, triggers: Triggers, queue_arn: str) -> list[tuple[str, int]]:
        """(function, batch size) of every trigger of the queue."""
        raise NotImplementedError("a subclass says how to read a queue's triggers")

    def test_attach_runs_the_function_with_its_batch_size(self, triggers: Triggers, queue_arn: Callable[[], str],
                                                           functions: tuple[str, str]) -> None:
        first, second = queue_arn(), queue_arn()
        assert self.attached(triggers, first) == []
        triggers.attach(first, functions[0], batch_size=5)
        triggers.attach(second, functions[1])
        assert self.attached(triggers, first) == [(functions[0], 5)]
        assert self.attached(triggers, second) == [(functions[1], 10)]  # the default batch

    def test_attach_is_idempotent_and_keeps_the_trigger_a_queue_has(
            self, triggers: Triggers, queue_arn: Callable[[], str], functions: tuple[str, str]) -> None:
        arn = queue_arn()
        triggers.attach(arn, functions[0], batch_size=3)
        triggers.attach(arn, functions[0], batch_size=3)
        triggers.attach(arn, functions[1], batch_size=7)
        assert self.attached(triggers, arn) == [(functions[0], 3)]

    def test_detach_removes_the_trigger_and_is_idempotent(
            self, triggers: Triggers, queue_arn: Callable[[], str], functions: tuple[str, str]) -> None:
        arn, other = queue_arn(), queue_arn()
        triggers.attach(arn, functions[0])
        triggers.attach(other, functions[1])
        triggers.detach(arn)
        assert self.attached(triggers, arn) == []
        assert self.attached(triggers, other) == [(functions[1], 10)]  # another queue's stays
        triggers.detach(arn)
        triggers.detach(queue_arn())  # a queue that never had one

    def test_a_detached_queue_can_be_attached_again(
            self, triggers: Triggers, queue_arn: Callable[[], str], functions: tuple[str, str]) -> None:
        arn = queue_arn()
        triggers.attach(arn, functions[0])
        triggers.detach(arn)
        triggers.attach(arn, functions[1], batch_size=2)
        assert self.attached(triggers, arn) == [(functions[1], 2)]
