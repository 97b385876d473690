"""The prototype bench_cache measures the service against (benchmarks/prototype.py) does the work
it claims, on a real redis-server: a ceiling that answered the wrong voxels, or skipped the
page-in, would make every ratio to it a lie."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from benchmarks import prototype
from ndstore.core import wire
from ndstore.core.synthetic import em_like

BLOSC = wire.format_for("application/blosc")


def call(method: str, path: str, query: str = "", body: bytes = b"") -> tuple[str, bytes]:
    started: dict[str, Any] = {}
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    chunks = prototype.app(environ, lambda status, headers: started.update(status=status))
    return started["status"], b"".join(chunks)


@pytest.fixture
def served(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setenv(prototype.REDIS_ENV, redis_url)
    monkeypatch.setenv(prototype.OBJECTS_ENV, str(tmp_path))
    prototype._redis.cache_clear()
    client = redis.Redis.from_url(redis_url)
    yield client
    client.delete("proto:0", "proto:1")
    prototype._redis.cache_clear()


def test_hot_cold_and_written_supercuboids_come_back_voxel_for_voxel(served: redis.Redis, tmp_path: Path) -> None:
    volume, other = em_like(prototype.SHAPE, seed=1), em_like(prototype.SHAPE, seed=2)
    prototype.store(served, 0, volume)
    status, body = call("GET", "/0")
    assert status.startswith("200") and np.array_equal(BLOSC.decode(body, prototype.SHAPE, volume.dtype), volume)

    prototype.store_object(tmp_path, 1, other)
    status, body = call("GET", "/1", "cold")
    assert status.startswith("200") and np.array_equal(BLOSC.decode(body, prototype.SHAPE, other.dtype), other)
    assert served.hlen("proto:1") == len(prototype.FIELDS)  # paged in, as the service's cold read does

    status, _ = call("POST", "/0", body=BLOSC.encode(other))
    assert status.startswith("201")
    assert np.array_equal(BLOSC.decode(call("GET", "/0")[1], prototype.SHAPE, other.dtype), other)
    assert call("GET", "/7")[0].startswith("404")
