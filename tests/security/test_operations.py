"""Attackers of the operator's routes: /metrics (staff only, the whole service's figures) and
/healthz (no token: a load balancer's probe), and of the per-request log line and counters,
which every request feeds with what the client chose."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ndstore.api import operations
from tests.security.conftest import CountingBody, token_for, wsgi


@pytest.fixture(autouse=True)
def _fresh_health() -> None:
    operations._last_health = (float("-inf"), 0, {})


def test_metrics_are_refused_without_a_token_and_to_a_user_who_is_not_staff(db: Any) -> None:
    assert wsgi("GET", "/metrics").status == 401
    _, token = token_for("mallory")
    refused = wsgi("GET", "/metrics", token=token)
    assert refused.status == 403 and b"ndstore_" not in refused.body


def test_a_body_sent_to_metrics_or_healthz_is_never_read(db: Any) -> None:
    _, token = token_for("mallory")
    for path, who in (("/metrics", None), ("/metrics", token), ("/healthz", None)):
        body = CountingBody(64 << 20)
        answer = wsgi("POST", path, body, token=who)
        assert answer.status in (401, 403, 404, 405, 413), (path, answer.status)
        assert body.read_bytes == 0, (path, body.read_bytes)


def test_healthz_says_which_part_fails_but_not_where_or_why(db: Any, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from ndstore import wiring
    from ndstore.ops.localstack import free_port

    port = free_port()
    monkeypatch.setenv("NDSTORE_BLAZE_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    wiring.services.cache_clear()
    with caplog.at_level(logging.WARNING, logger="ndstore.health"):
        answer = wsgi("GET", "/healthz", extra={"HTTP_HOST": "attacker.example"})
    assert answer.status == 503 and answer.json()["parts"]["blaze_redis"] == "failing"
    assert str(port).encode() not in answer.body and b"127.0.0.1" not in answer.body and b"Error" not in answer.body
    assert any(str(port) in r.getMessage() for r in caplog.records)  # the operator's log has the why


def test_a_flood_of_health_probes_reaches_the_stores_once_a_second(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore.wiring import services

    probes = dict(services().probes)
    calls = {"n": 0}

    def counted() -> object:
        calls["n"] += 1
        return probes["object_store"]()

    monkeypatch.setitem(services().probes, "object_store", counted)  # type: ignore[index]
    now = {"t": 1000.0}  # the flood lands within one second whatever the machine's load
    monkeypatch.setattr(operations, "_clock", lambda: now["t"])
    # what is counted here is how often the stores are asked, not how fast a loaded machine answers
    monkeypatch.setattr(operations, "PROBE_DEADLINE_S", 30.0)
    answers = {wsgi("GET", "/healthz").status for _ in range(50)}
    assert answers == {200} and calls["n"] == 1
    now["t"] += operations.HEALTH_TTL_S  # a second later the next probe looks again
    assert wsgi("GET", "/healthz").status == 200 and calls["n"] == 2


def test_what_a_client_chose_never_becomes_a_metric_label_or_a_log_line_of_its_own(
        db: Any, caplog: pytest.LogCaptureFixture) -> None:
    from ndstore.wiring import services

    metrics = services().metrics
    metrics.flush()
    before = {name for name, _ in metrics.snapshot().counters}
    with caplog.at_level(logging.INFO, logger="ndstore.requests"):
        for i in range(20):
            wsgi(f"X{i}METHOD", f"/v1/nothing-{i}\nINFO forged line user=1")
    metrics.flush()
    labels = {labels for name, labels in metrics.snapshot().counters if name == "requests_total"}
    assert not any("METHOD" in raw or "nothing-" in raw for raw in labels), labels
    assert {name for name, _ in metrics.snapshot().counters} - before <= {"requests_total", "request_bytes_total",
                                                                            "errors_total"}
    lines = [r.getMessage() for r in caplog.records if r.name == "ndstore.requests"]
    assert len(lines) == 20 and all("\n" not in line and line.startswith("other ") for line in lines), lines[:2]
