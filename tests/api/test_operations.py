"""What an operator sees: /metrics in Prometheus text format, /healthz, one log line per request,
and a loss of acknowledged writes refused with a 503 naming it until `ndstore recover` accepts it."""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import pytest
import redis
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from ndstore.api import operations
from tests.api.conftest import Dataset, make_dataset

OCTET = "application/octet-stream"


def scrape(client: APIClient) -> dict[str, Any]:
    """Every sample of /metrics by (name, sorted labels)."""
    from ndstore.wiring import services

    services().metrics.flush()  # what this process counted, as its flusher thread does every second
    r = client.get("/metrics")
    assert r.status_code == 200, r.content
    assert r["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(r.content.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return float(samples.get((name, tuple(sorted(labels.items()))), 0.0))


def test_metrics_parse_and_move_when_a_request_is_served(admin: APIClient, dataset: Dataset) -> None:
    url = dataset.cutout("img8", 0, (0, 64), (0, 64), (0, 4))
    before = scrape(admin)
    labels = {"route": "CutoutView", "method": "GET", "code": "2xx"}
    r = admin.get(url, HTTP_ACCEPT=OCTET)
    assert r.status_code == 200
    from ndstore.wiring import services

    services().cache_tier.settle()  # the read's page-in is stored after its answer
    after = scrape(admin)
    assert value(after, "ndstore_requests_total", **labels) == value(before, "ndstore_requests_total", **labels) + 1
    durations = ("ndstore_request_duration_seconds_count", {"route": "CutoutView"})
    assert value(after, durations[0], **durations[1]) == value(before, durations[0], **durations[1]) + 1
    out = value(after, "ndstore_request_bytes_total", route="CutoutView", direction="out")
    assert out - value(before, "ndstore_request_bytes_total", route="CutoutView", direction="out") == 64 * 64 * 4
    assert value(after, "ndstore_cache_reads_total", outcome="miss") > value(before, "ndstore_cache_reads_total",
                                                                              outcome="miss")
    for gauge in ("ndstore_cache_memory_bytes", "ndstore_write_back_lag_seconds", "ndstore_blaze_pending_bytes",
                  "ndstore_lost_supercuboids"):
        assert (gauge, ()) in after, gauge
    assert value(after, "ndstore_cache_supercuboids", state="resident") >= 1
    assert all(v == 0 for (name, _), v in after.items() if name == "ndstore_scrape_error"), after


def test_errors_are_counted_by_kind_and_status(admin: APIClient, dataset: Dataset) -> None:
    before = scrape(admin)
    assert admin.get(dataset.cutout("img8", 0, (0, 99999), (0, 64), (0, 4))).status_code == 400
    after = scrape(admin)
    key = {"kind": "OutOfBounds", "status": "400"}
    assert value(after, "ndstore_errors_total", **key) == value(before, "ndstore_errors_total", **key) + 1


def test_healthz_names_every_part_and_answers_without_a_token(db: Any) -> None:
    operations._last_health = (float("-inf"), 0, {})
    r = APIClient().get("/healthz", HTTP_HOST="10.1.2.3:8000")  # a load balancer's probe: its own Host
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["status"] == "ok"
    assert set(body["parts"]) == {"database", "cache_redis", "lock_redis", "blaze_redis", "object_store", "index",
                                  "label_index"}
    head = APIClient().head("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert head.status_code == 200 and head.content == b""  # the status is the answer


def test_healthz_is_503_naming_a_part_that_does_not_answer(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring
    from ndstore.ops.localstack import free_port

    monkeypatch.setenv("NDSTORE_BLAZE_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    wiring.services.cache_clear()
    operations._last_health = (float("-inf"), 0, {})
    r = APIClient().get("/healthz")
    assert r.status_code == 503
    body = r.json()
    assert body["parts"]["blaze_redis"] == "failing" and body["parts"]["cache_redis"] == "ok"
    assert "blaze_redis" in body["message"]


def test_one_log_line_per_request(admin: APIClient, dataset: Dataset, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ndstore.requests"):
        admin.get(dataset.cutout("img8", 0, (0, 8), (0, 8), (0, 1)), HTTP_ACCEPT=OCTET)
    lines = [r.getMessage() for r in caplog.records if r.name == "ndstore.requests"]
    assert len(lines) == 1, lines
    method, path, route, status, bytes_in, bytes_out, ms, user = lines[0].split()
    assert (method, route, status, bytes_in, bytes_out) == ("GET", "CutoutView", "200", "in=0", "out=64")
    assert path.startswith("/v1/cutout/") and ms.endswith("ms") and user.startswith("user=") and user != "user=-"


def test_acknowledged_writes_lost_by_the_cache_redis_are_refused_until_the_loss_is_accepted(
        admin: APIClient, service_env: dict[str, str]) -> None:
    from ndstore.wiring import services

    ds = make_dataset(admin, "lost", channels={"img8": "uint8"})
    url = ds.cutout("img8", 0, (0, 64), (0, 64), (0, 4))
    data = np.full((4, 64, 64), 9, np.uint8)
    assert admin.post(url, data.tobytes(), content_type=OCTET).status_code == 201
    services().cache_tier.keep_ledger()  # the flusher's round: it wrote nothing back yet
    redis.Redis.from_url(service_env["NDSTORE_REDIS_URL"]).flushdb()  # the cache Redis came back empty

    r = admin.get(url, HTTP_ACCEPT=OCTET)
    assert r.status_code == 503, r.content
    body = r.json()
    assert "lost writes the service had acknowledged" in body["message"] and "ndstore recover" in body["message"]
    assert len(body["lost"]) == 1 and "Retry-After" not in r  # waiting does not bring them back
    assert admin.post(url, data.tobytes(), content_type=OCTET).status_code == 503

    listing = io.StringIO()
    call_command("ndstore_recover", stdout=listing)
    assert "lost/e1/img8: 1 supercuboids lost acknowledged writes" in listing.getvalue()
    assert "came back without its data" in listing.getvalue()
    call_command("ndstore_recover", accept_loss=True, channel="lost/e1/img8", stdout=io.StringIO())
    r = admin.get(url, HTTP_ACCEPT=OCTET)
    assert r.status_code == 200 and not np.frombuffer(r.content, np.uint8).any()  # the base tier's: nothing
