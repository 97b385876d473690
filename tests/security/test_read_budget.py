"""An anonymous client behind the front amplifies its reads with Ranges: a 1-byte Range of a
16 MiB chunk makes the service read, assemble and encode the whole 16 MiB. On main nothing
counted those bytes: one address could make the service read 16 MiB per request at the anonymous
request rate (3000/min: 800 MiB/s). Now each data GET is charged, before it reads anything, the
bytes it reads to make its whole answer, against its caller's read budget (here 1 MiB/s after a
burst of 56 MiB per client address, the address taken from the trusted X-Forwarded-For hop as
the anonymous request rate takes it); past it, 429 with Retry-After, before anything is read."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from rest_framework.test import APIClient

from tests.api.conftest import make_dataset

MiB = 1 << 20
CHUNK = "/precomputed/pub/e1/img8/0/0-512_0-512_0-64"  # 512 x 512 x 64 uint8: 16 MiB
CUTOUT = "/v1/cutout/pub/e1/img8/0/0:512/0:512/0:64/"
SMALL = "/v1/cutout/pub/e1/img8/0/0:64/0:64/0:8/"
OCTET = "application/octet-stream"


@pytest.fixture
def public_chunk(admin: APIClient, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[None]:
    """A public channel holding a 16 MiB chunk of random voxels; anonymous callers may read 1 MiB/s
    after a burst of 56 MiB (3.5 chunks); one trusted proxy in front (NDSTORE_NUM_PROXIES=1)."""
    from ndstore import wiring

    for name, value in {"NDSTORE_ANON_READ_BYTES_PER_S": str(MiB), "NDSTORE_ANON_READ_BYTES_BURST": str(56 * MiB),
                        "NDSTORE_ANON_READ_RATE": "0"}.items():
        monkeypatch.setenv(name, value)
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    wiring.services.cache_clear()
    make_dataset(admin, "pub", frame=(512, 512, 64), levels=1)
    data = np.random.default_rng(5).integers(0, 256, (64, 512, 512), np.uint8)
    assert admin.post(CUTOUT, data.tobytes(), content_type=OCTET).status_code == 201
    assert admin.put("/v1/collection/pub/", {"public": True}, format="json").status_code == 200
    yield
    wiring.services.cache_clear()


def behind_the_front(address: str, spoofed: str = "") -> APIClient:
    """A client whose requests reach the service through the one trusted proxy (127.0.0.1), which
    appends the address it saw to what the client sent as X-Forwarded-For."""
    return APIClient(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=f"{spoofed}{address}")


def owed_s(address: str) -> float:
    """Seconds until the address's byte bucket is full again: the bytes charged to it / its rate."""
    from ndstore.wiring import services

    full = redis.Redis.from_url(services().config.redis_url).get(f"ndrb:{{anon:{address}}}")
    return 0.0 if full is None else float(full) / 1000 - time.time()


def test_one_byte_ranges_are_charged_the_whole_chunk_and_refused_past_the_budget(public_chunk: None) -> None:
    attacker = behind_the_front("203.0.113.9")
    first = attacker.get(CHUNK, HTTP_RANGE="bytes=0-0")
    answers = [first,
               attacker.get(CUTOUT, HTTP_RANGE="bytes=5-5", HTTP_ACCEPT=OCTET),  # any data view: one budget
               attacker.head(CHUNK),  # a HEAD makes the whole body too
               attacker.get(CHUNK, HTTP_IF_NONE_MATCH=first["ETag"])]  # and so does a 304
    assert [r.status_code for r in answers] == [206, 206, 200, 304]
    assert sum(len(r.content) for r in answers) == 2  # two bytes sent ...
    assert 60 < owed_s("203.0.113.9") <= 64  # ... four 16 MiB reads charged, at 1 MiB/s

    refused = attacker.get(CHUNK, HTTP_RANGE="bytes=0-0")
    assert refused.status_code == 429
    message = refused.json()["message"]
    assert "NDSTORE_ANON_READ_BYTES_PER_S" in message and "Range" in message and "token" in message, message
    assert 4 <= int(refused["Retry-After"]) <= 9  # 64 MiB owed, 56 MiB of burst: ~8 s until not empty
    assert owed_s("203.0.113.9") <= 64  # the refused request read nothing and was charged nothing
    spoofing = behind_the_front("203.0.113.9", spoofed="198.51.100.1, ")
    assert spoofing.get(CHUNK, HTTP_RANGE="bytes=0-0").status_code == 429  # only the trusted hop counts


def test_other_addresses_and_readers_under_the_budget_are_unaffected(admin: APIClient, public_chunk: None) -> None:
    attacker = behind_the_front("203.0.113.9")
    assert [attacker.get(CHUNK, HTTP_RANGE="bytes=0-0").status_code for _ in range(5)] == [206] * 4 + [429]
    neighbour = behind_the_front("203.0.113.10")
    assert neighbour.get(CHUNK, HTTP_RANGE="bytes=0-0").status_code == 206
    viewer = behind_the_front("203.0.113.11")  # small reads: 32 KiB each, 1.6 MiB in all
    assert all(viewer.get(SMALL, HTTP_ACCEPT=OCTET).status_code == 200 for _ in range(50))
    assert all(admin.get(CHUNK, HTTP_RANGE="bytes=0-0").status_code == 206 for _ in range(6))  # tokens: theirs
