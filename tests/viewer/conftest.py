"""Viewer tests run against the API tests' wiring (real Redis, moto's S3 + DynamoDB; `_wired` is
autouse) and use the same users, so those fixtures are re-exported here, not copied."""

from __future__ import annotations

from tests.api.conftest import _wired, admin  # noqa: F401  (fixtures, re-exported)
