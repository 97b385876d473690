"""Cached metadata lookups never outlive a change: a revoked token or grant, a deleted channel or
a changed frame is seen by the next request; without the generation's Redis, nothing is cached."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.api import meta_cache
from ndstore.api.models import ApiToken, Channel, Grant
from ndstore.core.errors import StorageError
from ndstore.storage.generation import KEY, RedisGeneration
from tests.api.conftest import client_for, make_dataset

URL = "/v1/cutout/mc/e1/img8/0/0:16/0:16/0:2/"


@pytest.fixture
def reader(admin: APIClient) -> tuple[APIClient, User]:
    make_dataset(admin, name="mc")
    user = User.objects.create(username="reader")
    assert admin.post("/v1/permissions/", {"user": "reader", "collection": "mc", "level": "read"},
                      format="json").status_code == 201
    client = client_for(user)
    assert client.get(URL).status_code == 200  # the token, the channel and the level are cached now
    return client, user


def test_a_revoked_token_is_refused_at_once(reader: tuple[APIClient, User]) -> None:
    client, user = reader
    ApiToken.objects.filter(user=user).delete()
    r = client.get(URL)
    assert r.status_code == 401 and "invalid or revoked" in r.json()["message"]


def test_a_deactivated_user_is_refused_at_once(reader: tuple[APIClient, User]) -> None:
    client, user = reader
    user.is_active = False
    user.save()
    assert client.get(URL).status_code == 401


def test_a_revoked_grant_is_refused_at_once(reader: tuple[APIClient, User], admin: APIClient) -> None:
    client, _ = reader
    assert admin.delete("/v1/permissions/?collection=mc&user=reader").status_code == 204
    assert client.get(URL).status_code == 403


def test_a_deleted_channel_is_gone_at_once_and_a_new_one_of_its_name_is_a_new_channel(
        reader: tuple[APIClient, User], admin: APIClient) -> None:
    client, _ = reader
    body = np.full((2, 16, 16), 9, np.uint8).tobytes()
    assert admin.generic("POST", URL, body, content_type="application/octet-stream").status_code == 201
    old_id = Channel.objects.get(name="img8").id
    assert admin.delete("/v1/collection/mc/experiment/e1/channel/img8/").status_code == 204
    assert client.get(URL).status_code == 404
    assert admin.post("/v1/collection/mc/experiment/e1/channel/img8/", {"datatype": "uint8"},
                      format="json").status_code == 201
    assert Channel.objects.get(name="img8").id != old_id
    r = client.get(URL, HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 200 and not np.frombuffer(r.content, np.uint8).any()  # not the old voxels


def test_a_change_behind_djangos_back_is_seen_after_max_age(reader: tuple[APIClient, User],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    client, user = reader
    Grant.objects.filter(user=user).update(level="write")  # a queryset update sends no signal
    body = np.full((2, 16, 16), 1, np.uint8).tobytes()
    assert client.generic("POST", URL, body, content_type="application/octet-stream").status_code == 403
    monkeypatch.setattr(meta_cache, "MAX_AGE_S", 0.0)
    assert client.generic("POST", URL, body, content_type="application/octet-stream").status_code == 201


def test_without_the_generation_nothing_is_cached(reader: tuple[APIClient, User], monkeypatch: pytest.MonkeyPatch,
                                                  admin: APIClient) -> None:
    client, user = reader

    class Down:
        def current(self) -> int:
            raise StorageError("metadata generation unavailable: connection refused")

        def bump(self) -> int:
            raise StorageError("metadata generation unavailable: connection refused")

    monkeypatch.setattr(meta_cache, "metadata_generation", lambda: Down())
    assert client.get(URL).status_code == 200
    Grant.objects.filter(user=user).delete()  # the bump fails (logged); the lookup goes to the database
    assert client.get(URL).status_code == 403


def test_the_generation_starts_at_random_and_never_returns_after_a_flush(redis_url: str, db: Any) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(KEY)
    gen = RedisGeneration(client)
    first = gen.current()
    assert gen.current() == first and gen.bump() == first + 1 and gen.current() == first + 1
    client.delete(KEY)
    assert gen.bump() not in (first + 1, first + 2, 1)
    client.delete(KEY)
    assert gen.current() not in (first, first + 1)


def test_a_request_reads_the_generation_once_and_again_after_its_own_change(db: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    class Counting:
        value = 7

        def current(self) -> int:
            reads.append(self.value)
            return self.value

    monkeypatch.setattr(meta_cache, "metadata_generation", lambda: Counting())
    meta_cache.cached("outside", lambda: 1)
    meta_cache.cached("outside", lambda: 1)
    assert len(reads) == 2  # outside a request: read every time

    def view(_: Any) -> Any:
        meta_cache.cached("a", lambda: 1)
        meta_cache.cached("b", lambda: 2)
        assert len(reads) == 3  # one read for both lookups
        Counting.value = 8
        meta_cache.forget_request_generation()  # what a metadata change's signal does
        assert meta_cache.cached("a", lambda: 3) == 3  # re-read: generation 8, reloaded
        return "response"

    assert meta_cache.RequestGeneration(view)(None) == "response"  # type: ignore[arg-type]
    assert reads == [7, 7, 7, 8]
    meta_cache.cached("outside", lambda: 1)
    assert len(reads) == 5  # the request's memo ended with it
