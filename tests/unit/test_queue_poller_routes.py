"""The local Lambda runner's poller (lambdas/runner.py) lists its queues every refresh, but looks
up a queue's URL and ARN once while the queue stays listed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from lambdas.runner import QueuePoller
from ndstore.storage.sqlite_queue import SqliteQueues


class Counted:
    def __init__(self, queues: SqliteQueues):
        self.queues, self.calls = queues, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        return getattr(self.queues, name)


def test_a_queue_is_looked_up_once_while_it_stays_listed(tmp_path: Path) -> None:
    queues = SqliteQueues(tmp_path / "queues.sqlite3")
    for name in ("p-j1-supercuboid", "p-j1-cleanup", "p-j1-upload", "other-j1-cleanup"):
        queues.create(name, 30, 3)
    counted = Counted(queues)
    poller = QueuePoller(counted, "p", refresh_s=0)  # type: ignore[arg-type]

    first = poller.routes()
    assert sorted(url for url, _, _ in first) == ["sqlite-queue://p-j1-cleanup", "sqlite-queue://p-j1-supercuboid"]
    assert counted.calls == {"names": 1, "url": 2, "arn": 2}  # upload queues are the client's: no handler

    counted.calls.clear()
    assert poller.routes() == first
    assert counted.calls == {"names": 1}

    queues.delete("p-j1-cleanup")  # a job completed
    queues.create("p-j2-supercuboid", 30, 3)
    counted.calls.clear()
    assert sorted(url for url, _, _ in poller.routes()) == ["sqlite-queue://p-j1-supercuboid",
                                                          "sqlite-queue://p-j2-supercuboid"]
    assert counted.calls == {"names": 1, "url": 1, "arn": 1}
