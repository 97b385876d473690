"""The JobState contract on each implementation: DynamoDB over real HTTP (moto's server) and the
SQLite file of the local stack."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ndstore.storage.interfaces import JobState
from ndstore.storage.job_state import DynamoJobState
from ndstore.storage.sqlite_job_state import SqliteJobState
from ndstore.testing.job_state import JobStateContract


def ready(state: JobState) -> JobState:
    state.ensure_ready()
    state.ensure_ready()  # idempotent
    return state


class TestSqliteJobState(JobStateContract):
    @pytest.fixture
    def state(self, tmp_path: Path) -> JobState:
        return ready(SqliteJobState(tmp_path / "state.sqlite3"))


class TestDynamoJobState(JobStateContract):
    @pytest.fixture
    def state(self, moto_endpoint: str) -> JobState:
        return ready(DynamoJobState(f"jobs-{uuid.uuid4().hex[:12]}", moto_endpoint))
