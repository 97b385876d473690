"""Anonymous reads are rate limited per address across workers; control-plane actions are audited."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.core.errors import StorageError
from ndstore.storage.rate_limit import RedisRateLimiter
from tests.api.conftest import client_for, make_dataset

BOX_URL = "/v1/cutout/pub/e1/img8/0/0:16/0:16/0:2/"


@pytest.fixture
def public(admin: APIClient) -> APIClient:
    make_dataset(admin, name="pub")
    assert admin.put("/v1/collection/pub/", {"public": True}, format="json").status_code == 200
    return admin


@pytest.fixture
def three_per_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring

    monkeypatch.setenv("NDSTORE_ANON_READ_RATE", "3/min")
    wiring.services.cache_clear()


def test_anonymous_reads_past_the_rate_get_429_with_retry_after(public: APIClient, three_per_minute: None) -> None:
    anon = APIClient(REMOTE_ADDR="10.0.0.7")
    assert [anon.get(BOX_URL).status_code for _ in range(3)] == [200, 200, 200]
    r = anon.get(BOX_URL)
    assert r.status_code == 429
    assert "too many anonymous requests" in r.json()["message"] and "token" in r.json()["message"]
    assert 0 < int(r["Retry-After"]) <= 61
    # another address has its own count; a token is not limited; anonymous writes stay 401
    assert APIClient(REMOTE_ADDR="10.0.0.8").get(BOX_URL).status_code == 200
    assert all(public.get(BOX_URL).status_code == 200 for _ in range(5))
    body = np.ones((2, 16, 16), np.uint8).tobytes()
    assert anon.generic("POST", BOX_URL, body, content_type="application/octet-stream").status_code == 401


def test_a_zero_rate_turns_the_limit_off(public: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from ndstore import wiring

    monkeypatch.setenv("NDSTORE_ANON_READ_RATE", "0")
    wiring.services.cache_clear()
    anon = APIClient()
    assert all(anon.get(BOX_URL).status_code == 200 for _ in range(10))


@pytest.mark.parametrize("rate", ["3000", "3000/fortnight", "x/min", "-1/min", "3000/min/2"])
def test_a_malformed_rate_stops_the_service_at_start_naming_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                                        rate: str) -> None:
    from ndstore.config import Config

    monkeypatch.setenv("NDSTORE_ANON_READ_RATE", rate)
    with pytest.raises(ValueError, match=r"NDSTORE_ANON_READ_RATE must look like 3000/min .*not '"):
        Config.from_env()


@pytest.mark.parametrize(("rate", "limit"), [("3000/min", (3000, 60)), (" 5/s ", (5, 1)), ("2/hour", (2, 3600)),
                                             ("0", None), ("", None), ("0/min", None)])
def test_rates_parse_to_requests_per_seconds(monkeypatch: pytest.MonkeyPatch, rate: str, limit: Any) -> None:
    from ndstore.config import Config

    monkeypatch.setenv("NDSTORE_ANON_READ_RATE", rate)
    assert Config.from_env().anon_read_limit == limit


def test_rate_limiter_windows(redis_url: str) -> None:
    now = [1000.0]
    limiter = RedisRateLimiter(redis.Redis.from_url(redis_url), clock=lambda: now[0])
    assert [limiter.hit("k", 2, 60) for _ in range(2)] == [0.0, 0.0]
    assert limiter.hit("k", 2, 60) == pytest.approx(20.0)  # the window [960, 1020) ends in 20 s
    assert limiter.hit("other", 2, 60) == 0.0
    now[0] = 1020.0
    assert limiter.hit("k", 2, 60) == 0.0


def test_rate_limiter_down_is_a_storage_error() -> None:
    limiter = RedisRateLimiter(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5))
    with pytest.raises(StorageError, match="rate-limit counters unavailable"):
        limiter.hit("k", 1, 60)
    with pytest.raises(StorageError, match="read budgets unavailable"):
        limiter.spend("k", 1, 1, 1)


def test_byte_buckets_admit_while_not_empty_charge_whole_costs_and_refill_at_the_rate(redis_url: str) -> None:
    now = [5000.0]
    limiter = RedisRateLimiter(redis.Redis.from_url(redis_url), clock=lambda: now[0])
    key = f"bucket-{now[0]}-{id(now)}"
    # 100 bytes/s after a burst of 250: three requests of 100 are admitted (the third takes it
    # 50 below empty), the fourth waits until it is above empty again (0.5 s) plus a ms
    assert [limiter.spend(key, 100, 100, 250) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.spend(key, 100, 100, 250) == pytest.approx(0.501)  # refused, and charged nothing
    assert limiter.spend("another", 100, 100, 250) == 0.0
    now[0] += 0.6  # 2.4 s of refill owed, under the burst's 2.5: not empty
    assert limiter.spend(key, 10**4, 100, 250) == 0.0  # admitted, though larger than the burst, and charged in full
    assert limiter.spend(key, 1, 100, 250) == pytest.approx(99.901)  # so the next waits 102.4 s - 2.5 s + 1 ms


def test_counting_and_spending_write_nothing_to_the_redis_log(redis_url: str) -> None:
    """The Redis fsyncs every logged write before it answers, and every data GET spends: the
    counters are not worth a disk flush per read (a restarted Redis forgets them)."""
    client = redis.Redis.from_url(redis_url)
    assert client.config_get("appendonly")["appendonly"] == "yes"
    limiter = RedisRateLimiter(client, clock=lambda: 6000.0)  # window 100 of 60 s
    logged = int(client.info("persistence")["aof_current_size"])
    for i in range(20):
        assert limiter.hit(f"unlogged-{i % 3}", 100, 60) == 0.0
        assert limiter.spend(f"unlogged-{i % 3}", 100, 10**6, 10**7) == 0.0
    assert int(client.info("persistence")["aof_current_size"]) == logged
    assert int(client.get("ndrl:{unlogged-0}:100") or 0) == 7  # yet they count


@pytest.mark.parametrize("setting", [{"NDSTORE_ANON_READ_BYTES_PER_S": "-1"}, {"NDSTORE_READ_BYTES_BURST": "0"},
                                     {"NDSTORE_ANON_READ_BYTES_BURST": "x"}])
def test_a_malformed_read_budget_stops_the_service_at_start(monkeypatch: pytest.MonkeyPatch,
                                                            setting: dict[str, str]) -> None:
    from ndstore.config import Config

    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="NDSTORE_(ANON_)?READ_BYTES"):
        Config.from_env()


def test_control_plane_actions_are_audited_data_plane_writes_are_not(admin: APIClient) -> None:
    from ndstore.api.models import AuditEntry

    make_dataset(admin, name="aud")
    User.objects.create(username="mallory")
    mallory = client_for(User.objects.get(username="mallory"))
    assert mallory.post("/v1/permissions/", {"user": "mallory", "collection": "aud", "level": "admin"},
                        format="json").status_code == 403
    assert admin.post("/v1/permissions/", {"user": "mallory", "collection": "aud", "level": "read"},
                      format="json").status_code == 201
    body = np.ones((2, 16, 16), np.uint8).tobytes()
    assert admin.generic("POST", "/v1/cutout/aud/e1/img8/0/0:16/0:16/0:2/", body,
                         content_type="application/octet-stream").status_code == 201
    assert admin.delete("/v1/collection/aud/experiment/e1/channel/img8/").status_code == 204

    entries = admin.get("/v1/audit/").json()["entries"]
    seen = [(e["user"], e["method"], e["path"], e["status"]) for e in reversed(entries)]
    assert seen == [
        ("root", "POST", "/v1/coord/aud_frame/", 201),
        ("root", "POST", "/v1/collection/aud/", 201),
        ("root", "POST", "/v1/collection/aud/experiment/e1/", 201),
        ("root", "POST", "/v1/collection/aud/experiment/e1/channel/img8/", 201),
        ("mallory", "POST", "/v1/permissions/", 403),
        ("root", "POST", "/v1/permissions/", 201),
        ("root", "DELETE", "/v1/collection/aud/experiment/e1/channel/img8/", 204),
    ]
    grant = entries[1]
    assert grant["body"] == {"user": "mallory", "collection": "aud", "level": "read"}
    assert grant["remote_addr"] == "127.0.0.1"
    assert AuditEntry.objects.filter(path__startswith="/v1/cutout/").count() == 0

    only_mallory = admin.get("/v1/audit/?user=mallory").json()["entries"]
    assert [e["status"] for e in only_mallory] == [403]
    page = admin.get(f"/v1/audit/?limit=2&before={entries[0]['id']}").json()["entries"]
    assert [e["id"] for e in page] == [entries[1]["id"], entries[2]["id"]]


@pytest.mark.parametrize("query,message", [("limit=0", "limit must be an integer from 1 to 1000"),
                                           ("limit=x", "limit must be"), ("before=-1", "before must be"),
                                           ("limit=%C2%B9", "limit must be")])  # superscript one: isdigit()
def test_bad_audit_queries(admin: APIClient, query: str, message: str) -> None:
    r = admin.get(f"/v1/audit/?{query}")
    assert r.status_code == 400 and message in r.json()["message"]


def test_only_superusers_read_the_audit_log(admin: APIClient, db: Any) -> None:
    assert APIClient().get("/v1/audit/").status_code == 401
    staff = client_for(User.objects.create(username="staff", is_staff=True))
    r = staff.get("/v1/audit/")
    assert r.status_code == 403 and "superusers" in r.json()["message"]
