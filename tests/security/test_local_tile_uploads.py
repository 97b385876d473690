"""The local tile store's upload route, `PUT /v1/ingest/tiles/{key}?expires=&signature=`: the
user's test (a leave to upload works, the pipeline hears of the tile) beside the attacker's (no
token is needed, so only the service's signature of this key, these metadata and this expiry
opens it; it is checked before the body is read)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core.tiles import encode_tile
from tests.api.conftest import Dataset
from tests.security.conftest import CountingBody, wsgi

JOB = {"collection": "c1", "experiment": "e1", "channel": "img8", "x_start": 0, "x_stop": 512, "y_start": 0,
       "y_stop": 256, "z_start": 0, "z_stop": 1, "tile_size_x": 256, "tile_size_y": 256}


@pytest.fixture
def local_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The local ingest backend (the default of `ndstore up`) in a data dir of the test's own."""
    from ndstore import wiring

    monkeypatch.setenv("NDSTORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NDSTORE_INGEST_BACKEND", "local")
    monkeypatch.setenv("NDSTORE_INGEST_PUBLIC_ENDPOINT_URL", "http://testserver")
    monkeypatch.delenv("NDSTORE_INGEST_ENDPOINT_URL", raising=False)
    wiring.services.cache_clear()
    yield
    wiring.services.cache_clear()


def leave(admin: APIClient, body: bytes) -> dict[str, Any]:
    """A job, a leased task, and the leave to upload `body` for it."""
    job = admin.post("/v1/ingest/", JOB, format="json").json()
    task = admin.post(f"/v1/ingest/{job['id']}/tasks/", {"max": 1}, format="json").json()["tasks"][0]
    r = admin.post(f"/v1/ingest/{job['id']}/uploads/",
                   {"tiles": [{**task, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}]}, format="json")
    assert r.status_code == 200, r.content
    return r.json()["uploads"][0]  # type: ignore[no-any-return]


def put(target: dict[str, Any], body: bytes | CountingBody, headers: dict[str, str] | None = None,
        query: str | None = None) -> Any:
    url = urlsplit(target["url"])
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or target["headers"]).items()}
    environ_query = url.query if query is None else query
    return wsgi("PUT", url.path, body, content_type="image/png", query=environ_query, extra=meta)


def test_a_leave_to_upload_stores_the_tile_and_announces_it(admin: APIClient, dataset: Dataset,
                                                             local_ingest: None) -> None:
    from ndstore.wiring import services

    body = encode_tile(np.full((256, 256), 9, np.uint8), "png")
    target = leave(admin, body)
    assert target["url"].startswith("http://testserver/v1/ingest/tiles/")
    answer = put(target, body)
    assert answer.status == 200, answer.body
    ingest = services().ingest
    key = urlsplit(target["url"]).path.removeprefix("/v1/ingest/tiles/")
    assert ingest.tiles.head(key) is not None
    events = ingest.queues.receive(ingest.url(ingest.events_queue), 10, wait_s=0)
    assert len(events) == 1 and key.replace("/", "%2F") in events[0].body
    assert ingest.tile_uploaded(key) == "recorded"


@pytest.mark.parametrize("attack", ["no signature", "forged signature", "other key", "other metadata", "expired"])
def test_only_the_services_signature_opens_the_route_and_before_the_body_is_read(
        admin: APIClient, dataset: Dataset, local_ingest: None, attack: str) -> None:
    from ndstore.wiring import services

    body = encode_tile(np.full((256, 256), 9, np.uint8), "png")
    target = leave(admin, body)
    url = urlsplit(target["url"])
    counting = CountingBody(len(body))
    if attack == "no signature":
        answer = wsgi("PUT", url.path, counting, content_type="image/png", query="")
        assert answer.status == 401  # no signature, no token: the gate
    else:
        query, headers = url.query, dict(target["headers"])
        if attack == "forged signature":
            query = query.replace("signature=", "signature=00")
        elif attack == "other metadata":
            headers["x-amz-meta-upload-sha256"] = "0" * 64
        elif attack == "expired":
            query = "expires=1000&" + query.split("&", 1)[1]
        path = url.path.replace("/0.png", "/1.png") if attack == "other key" else url.path
        answer = wsgi("PUT", path, counting, content_type="image/png", query=query,
                      extra={f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})
        assert answer.status == 403, (answer.status, answer.body)
    assert counting.read_bytes == 0
    ingest = services().ingest
    assert ingest.queues.counts(ingest.url(ingest.events_queue)).total == 0  # nothing stored, nothing announced


@pytest.mark.parametrize("key", ["1/../../etc/passwd", "1/0/0/0/%2e%2e", "1//0/0/0.png", "1/0/0/0/a b.png"])
def test_hostile_keys_are_refused(dataset: Dataset, local_ingest: None, key: str) -> None:
    answer = wsgi("PUT", f"/v1/ingest/tiles/{key}", b"x", content_type="image/png",
                  query="expires=9999999999&signature=ab")
    assert answer.status in (400, 403, 404) and answer.content_type == "application/json", answer.body


def test_where_tiles_go_to_s3_the_route_is_not_there(admin: APIClient, dataset: Dataset, ingest_env: str) -> None:
    answer = wsgi("PUT", "/v1/ingest/tiles/1/0/0/0/0.png", b"x", content_type="image/png",
                  query="expires=9999999999&signature=ab")
    assert answer.status == 404 and "presigned S3" in answer.json()["message"]
