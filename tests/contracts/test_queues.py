"""The WorkQueue contract on each implementation: SQS over real HTTP (moto's server) and the
SQLite file of the local stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from ndstore.storage.interfaces import WorkQueue
from ndstore.storage.sqlite_queue import SqliteQueues
from ndstore.storage.sqs import SqsQueues
from ndstore.testing.queues import WorkQueueContract


class TestSqsQueues(WorkQueueContract):
    @pytest.fixture
    def queues(self, moto_endpoint: str) -> WorkQueue:
        return SqsQueues(moto_endpoint)


class TestSqliteQueues(WorkQueueContract):
    @pytest.fixture
    def queues(self, tmp_path: Path) -> WorkQueue:
        return SqliteQueues(tmp_path / "queues.sqlite3")
