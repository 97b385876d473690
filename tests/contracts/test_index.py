"""The SupercuboidIndex contract on each implementation: a SQLite file, DynamoDB over real HTTP
(moto's server), and the in-memory fake."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.interfaces import SupercuboidIndex
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex
from ndstore.testing.index import SupercuboidIndexContract
from ndstore.testing.memory import MemorySupercuboidIndex


def ready(index: SupercuboidIndex) -> SupercuboidIndex:
    assert index.ensure_ready() is None
    return index


class TestSqliteSupercuboidIndex(SupercuboidIndexContract):
    @pytest.fixture
    def index(self, tmp_path: Path) -> SupercuboidIndex:
        return ready(SqliteSupercuboidIndex(tmp_path / "index.sqlite3"))


class TestDynamoSupercuboidIndex(SupercuboidIndexContract):
    @pytest.fixture
    def index(self, moto_endpoint: str) -> SupercuboidIndex:
        return ready(DynamoSupercuboidIndex(f"t-{uuid.uuid4().hex[:12]}", moto_endpoint))


class TestMemorySupercuboidIndex(SupercuboidIndexContract):
    @pytest.fixture
    def index(self) -> SupercuboidIndex:
        return ready(MemorySupercuboidIndex())
