"""The DATABASE_URL path: the resource and permission suites run again with PostgreSQL as the
metadata database (a subprocess, since Django reads DATABASE_URL once at start-up)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PG_URL = os.environ.get("NDSTORE_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def _reachable(url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=3).close()
        return True
    except psycopg.Error:
        return False


@pytest.mark.postgres
def test_api_suites_pass_on_postgresql() -> None:
    if not _reachable(PG_URL):
        pytest.skip(f"no PostgreSQL at {PG_URL} (set NDSTORE_TEST_POSTGRES_URL)")
    env = {**os.environ, "DATABASE_URL": PG_URL}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db",
         "tests/api/test_resources.py", "tests/api/test_auth.py",
         "tests/api/test_cutouts.py::test_time_series_cutouts"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "passed" in result.stdout and "failed" not in result.stdout
