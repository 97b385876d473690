"""API fixtures: the service wired to moto (S3 + DynamoDB) and Redis, users with tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.api import annotation_index
from ndstore.api.models import ApiToken, Grant


@pytest.fixture(autouse=True)
def _wired(service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every API test runs against the real adapters, with a bucket and an index table of its
    own: the test database is rolled back between tests and reuses ids, the stores are not."""
    from ndstore import wiring

    redis.Redis.from_url(service_env["NDSTORE_REDIS_URL"]).flushdb()  # the cache tier too
    redis.Redis.from_url(service_env["NDSTORE_BLAZE_REDIS_URL"]).flushdb()
    suffix = uuid.uuid4().hex[:10]
    monkeypatch.setenv("NDSTORE_S3_BUCKET", f"ndstore-test-{suffix}")
    monkeypatch.setenv("NDSTORE_DYNAMODB_TABLE", f"ndstore-test-{suffix}")
    wiring.services.cache_clear()
    wiring.metadata_generation.cache_clear()  # NDSTORE_REDIS_URL differs between modules (Redis Cluster)
    annotation_index.forget_all()  # a layer of a rolled-back test may come back with its id and version
    yield
    wiring.services.cache_clear()
    wiring.metadata_generation.cache_clear()


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        _, key = ApiToken.mint(user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def bearer(key: str) -> APIClient:
    """A client sending ``key`` as `Authorization: Bearer`."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def admin(db: Any) -> APIClient:
    user = User.objects.create(username="root", is_staff=True, is_superuser=True)
    return client_for(user)


@dataclass
class Dataset:
    collection: str
    experiment: str
    channels: dict[str, str]  # name -> datatype

    def cutout(self, channel: str, res: int, x: tuple[int, int], y: tuple[int, int], z: tuple[int, int],
               t: tuple[int, int] | None = None, direct: bool = False) -> str:
        prefix = "/v1/direct/cutout" if direct else "/v1/cutout"
        tail = f"{t[0]}:{t[1]}/" if t else ""
        return (f"{prefix}/{self.collection}/{self.experiment}/{channel}/{res}/"
                f"{x[0]}:{x[1]}/{y[0]}:{y[1]}/{z[0]}:{z[1]}/{tail}")


def make_dataset(client: APIClient, name: str = "c1", frame: tuple[int, int, int] = (1100, 700, 100),
                 levels: int = 3, method: str = "anisotropic", times: int = 1,
                 channels: dict[str, str] | None = None, frame_fields: dict[str, Any] | None = None) -> Dataset:
    """A coordinate frame, collection, experiment and channels; `frame_fields` adds to the frame
    (starts, voxel sizes, unit)."""
    channels = channels or {"img8": "uint8"}
    ok = client.post(f"/v1/coord/{name}_frame/",
                     {"x_stop": frame[0], "y_stop": frame[1], "z_stop": frame[2], **(frame_fields or {})},
                     format="json")
    assert ok.status_code == 201, ok.content
    assert client.post(f"/v1/collection/{name}/", {"description": "test"}, format="json").status_code == 201
    exp = {"coord_frame": f"{name}_frame", "num_hierarchy_levels": levels, "hierarchy_method": method,
           "num_time_samples": times}
    r = client.post(f"/v1/collection/{name}/experiment/e1/", exp, format="json")
    assert r.status_code == 201, r.content
    for ch, dtype in channels.items():
        kind = "annotation" if ch.startswith("ann") else "image"
        r = client.post(f"/v1/collection/{name}/experiment/e1/channel/{ch}/", {"type": kind, "datatype": dtype},
                        format="json")
        assert r.status_code == 201, r.content
    return Dataset(name, "e1", channels)


@pytest.fixture
def dataset(admin: APIClient) -> Dataset:
    return make_dataset(admin, channels={"img8": "uint8", "img16": "uint16", "img32": "uint32",
                                          "f32": "float32", "ann64": "uint64"})


@pytest.fixture
def grant() -> Any:
    def make(username: str, collection: str, level: str | None) -> APIClient:
        from ndstore.api.models import Collection

        user = User.objects.create(username=username)
        if level:
            Grant.objects.create(user=user, collection=Collection.objects.get(name=collection), level=level)
        return client_for(user)

    return make
