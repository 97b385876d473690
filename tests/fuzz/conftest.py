"""Fuzz fixtures: the service wired to the real adapters on loopback (moto, Redis) with no way
off the machine, and a count of the fuzz cases run.

Every hypothesis test here (schemathesis' too) counts the examples it ran. With NDSTORE_FUZZ_REPORT
set (to a path, or to 1 for benchmarks/results/fuzz.json) the session writes the counts per
module as JSON; without it nothing is written, so `make test` leaves the tree clean.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import itertools
import json
import os
import platform
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPORT = ROOT / "benchmarks" / "results" / "fuzz.json"


# --- the service on loopback ---------------------------------------------------------------

def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a Unix socket
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection to anything but loopback fails (and so fails the case that made it)."""
    connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> Any:
        if not _loopback(address):
            raise ConnectionRefusedError(f"fuzz tests stay on loopback; refused a connection to {address!r}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(scope="module")
def fuzz_service(service_env: dict[str, str], moto_endpoint: str) -> Iterator[dict[str, str]]:
    """One wiring per module (building it costs ~0.5 s of boto3 clients): a base-tier bucket and
    table, tile bucket and table, and ingest/downsample queue prefix of the module's own."""
    from ndstore import wiring

    suffix = uuid.uuid4().hex[:10]
    env = {"NDSTORE_S3_BUCKET": f"fuzz-{suffix}", "NDSTORE_DYNAMODB_TABLE": f"fuzz-{suffix}",
           "NDSTORE_INGEST_ENDPOINT_URL": moto_endpoint, "NDSTORE_TILE_BUCKET": f"fuzz-tiles-{suffix}",
           "NDSTORE_TILE_INDEX_TABLE": f"fuzz-tiles-{suffix}", "NDSTORE_INGEST_QUEUE_PREFIX": f"fuzz-{suffix}"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        wiring.services.cache_clear()
        yield {**service_env, **env}
        wiring.services.cache_clear()


_ID_BLOCKS = itertools.count(1)


def _fresh_ids() -> None:
    """Ids of this test's rows that no earlier test of the session used: the test database rolls
    back (and SQLite then hands the same ids out again), the module's stores do not."""
    from django.apps import apps
    from django.db import connection

    if connection.vendor != "sqlite":
        return  # sequences of other databases do not roll back
    start = next(_ID_BLOCKS) * 1_000_000
    tables = [m._meta.db_table for m in apps.get_models()]
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, start])


@pytest.fixture
def wired(fuzz_service: dict[str, str], db: Any, loopback_only: None) -> None:
    """The module's wiring with empty Redis servers (cache tier, locks, NDBlaze buffer) and ids
    of this test's own."""
    redis.Redis.from_url(fuzz_service["NDSTORE_REDIS_URL"]).flushdb()
    redis.Redis.from_url(fuzz_service["NDSTORE_BLAZE_REDIS_URL"]).flushdb()
    _fresh_ids()


# --- counting cases -------------------------------------------------------------------------

@dataclass
class ModuleCount:
    tests: int = 0
    cases: int = 0
    failures: int = 0
    seconds: float = 0.0
    per_test: dict[str, int] = field(default_factory=dict)


COUNTS: dict[str, ModuleCount] = {}


def _count_calls(inner: Callable[..., Any], on_call: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        on_call()
        return inner(*args, **kwargs)

    return counted


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Count the examples a hypothesis test runs (its documented `hypothesis.inner_test` hook)."""
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    module = COUNTS.setdefault(Path(str(item.fspath)).stem, ModuleCount())
    name = item.nodeid.split("::", 1)[-1].split("[", 1)[0]
    if handle is None:
        module.per_test[name] = module.per_test.get(name, 0) + 1
        module.cases += 1
        return (yield)
    original = handle.inner_test

    def one() -> None:
        module.cases += 1
        module.per_test[name] = module.per_test.get(name, 0) + 1

    handle.inner_test = _count_calls(original, one)
    try:
        return (yield)
    finally:
        handle.inner_test = original


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = COUNTS.setdefault(Path(report.fspath).stem, ModuleCount())
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        module.tests += 1
        module.seconds += report.duration
        module.failures += report.outcome == "failed"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("NDSTORE_FUZZ_REPORT")
    if not target or not COUNTS:
        return
    path = DEFAULT_REPORT if target == "1" else Path(target)
    ran = {name: m for name, m in sorted(COUNTS.items()) if m.tests}
    modules = {name: {"tests": m.tests, "cases": m.cases, "failures": m.failures, "seconds": round(m.seconds, 1),
                      "per_test": dict(sorted(m.per_test.items()))} for name, m in ran.items()}
    report = {
        "what": "fuzz cases run by tests/fuzz: schemathesis over /api/schema/, hypothesis over the body decoders, "
                "hostile writes and resource names",
        "cases": sum(m.cases for m in ran.values()),
        "failures": sum(m.failures for m in ran.values()),
        "tests": sum(m.tests for m in ran.values()),
        "seconds": round(sum(m.seconds for m in ran.values()), 1),
        "modules": modules,
        "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "wall_seconds": round(time.monotonic() - _START, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


_START = time.monotonic()
