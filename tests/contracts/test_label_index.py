"""The LabelIndex contract on each implementation: a SQLite file, DynamoDB over real HTTP (moto's
server), and the in-memory fake."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ndstore.storage.dynamodb_label_index import DynamoLabelIndex
from ndstore.storage.interfaces import LabelIndex
from ndstore.storage.sqlite_label_index import SqliteLabelIndex
from ndstore.testing.label_index import LabelIndexContract
from ndstore.testing.memory import MemoryLabelIndex


def ready(labels: LabelIndex) -> LabelIndex:
    assert labels.ensure_ready() is None
    return labels


class TestSqliteLabelIndex(LabelIndexContract):
    @pytest.fixture
    def labels(self, tmp_path: Path) -> LabelIndex:
        return ready(SqliteLabelIndex(tmp_path / "labels.sqlite3"))


class TestDynamoLabelIndex(LabelIndexContract):
    @pytest.fixture
    def labels(self, moto_endpoint: str) -> LabelIndex:
        return ready(DynamoLabelIndex(f"t-{uuid.uuid4().hex[:12]}", moto_endpoint))


class TestMemoryLabelIndex(LabelIndexContract):
    @pytest.fixture
    def labels(self) -> LabelIndex:
        return ready(MemoryLabelIndex())
