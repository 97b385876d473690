"""A failure nothing expected (a bug, a library raising something new) answers 500 in the same JSON
as every other error -- not Django's HTML page -- and tells the client nothing of the failure
itself: no exception text, no path, no traceback. The service's log has those; the metrics count it."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from ndstore.engine.cache.tier import CacheTier
from tests.api.conftest import Dataset
from tests.security.conftest import token_for

SECRET = "/srv/ndstore/secret-path token=abc123"


def failing(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"unexpected failure at {SECRET}")


@pytest.mark.django_db
@pytest.mark.parametrize("short_path", [True, False], ids=["data-routes", "drf"])
def test_an_unexpected_failure_is_a_json_500_that_names_nothing_of_it(dataset: Dataset, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture,
                                                                      settings: Any, short_path: bool) -> None:
    from ndstore.wiring import services

    settings.NDSTORE_LEAN_DATA_ROUTES = short_path  # ndstore/api/data_routes.py, or DRF's dispatch
    monkeypatch.setattr(CacheTier, "read", failing)  # a bug in the engine, under either dispatch
    client = APIClient(raise_request_exception=False)
    _, key = token_for("reader", is_superuser=True, is_staff=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    services().metrics.reset()
    answer = client.get(dataset.cutout("img8", 0, (0, 8), (0, 8), (0, 1)), HTTP_ACCEPT="application/octet-stream")
    assert answer.status_code == 500
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"status": 500, "message": "internal server error: the service could not answer this "
                                                       "request; its log has the details"}
    assert SECRET not in answer.content.decode() and "Traceback" not in answer.content.decode()
    assert any(r.exc_info and SECRET in str(r.exc_info[1]) for r in caplog.records)  # the log has it
    services().metrics.flush()
    counters = services().metrics.snapshot().counters
    assert counters.get(("errors_total", '{"kind":"unexpected","status":"500"}')) == 1
