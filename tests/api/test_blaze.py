"""`/v1/blaze/cutout/` and `/v1/blaze/merge/` through the Django app, on the real adapters."""

from __future__ import annotations

from typing import Any

import blosc
import numpy as np
import pytest
from rest_framework.test import APIClient

from blaze.daemon import MergeDaemon
from ndstore.wiring import services
from tests.api.conftest import Dataset


def blaze_url(ds: Dataset, ch: str, x: tuple[int, int], y: tuple[int, int], z: tuple[int, int]) -> str:
    return ds.cutout(ch, 0, x, y, z).replace("/v1/cutout/", "/v1/blaze/cutout/")


def post_blosc(client: APIClient, url: str, data: np.ndarray) -> Any:
    body = blosc.compress(data.tobytes(), typesize=data.dtype.itemsize)
    return client.generic("POST", url, body, content_type="application/blosc")


def get_array(client: APIClient, url: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    r = client.get(url, HTTP_ACCEPT="application/blosc")
    assert r.status_code == 200, r.content
    return np.frombuffer(blosc.decompress(r.content), dtype=dtype).reshape(shape)


def merge_via_daemon() -> None:
    svc = services()
    daemon = MergeDaemon(svc.blaze_buffer, svc.merge_requests, svc.merger_presence,
                         lambda: svc.merger.merge(svc.blaze_buffer.pending_names()), 1e9, 1)
    assert daemon.step() is not None


def test_blaze_write_is_read_back_through_blaze_and_through_the_cache_after_merge(admin: APIClient,
                                                                                 dataset: Dataset) -> None:
    data = np.random.default_rng(0).integers(0, 60000, (6, 40, 50), dtype=np.uint16)
    url = blaze_url(dataset, "img16", (10, 60), (5, 45), (2, 8))
    r = post_blosc(admin, url, data)
    assert r.status_code == 201, r.content
    assert int(r["X-NDBlaze-Sequence"]) >= 1
    assert np.array_equal(get_array(admin, url, data.shape, "uint16"), data)
    cache_url = dataset.cutout("img16", 0, (10, 60), (5, 45), (2, 8))
    assert np.array_equal(get_array(admin, cache_url, data.shape, "uint16"), data)  # every path sees it at once

    request = admin.post("/v1/blaze/merge/")
    assert request.status_code == 202
    status_url = request.json()["status"]
    assert admin.get(status_url).json()["state"] == "queued"
    merge_via_daemon()
    done = admin.get(status_url).json()
    assert done["state"] == "done" and done["blobs_applied"] == 1
    assert np.array_equal(get_array(admin, cache_url, data.shape, "uint16"), data)
    assert admin.get("/v1/blaze/merge/").json()["pending"]["blobs"] == 0


def test_overlapping_blaze_writes_apply_in_sequence_order(admin: APIClient, dataset: Dataset) -> None:
    """(Concurrent writers are tested at the engine level, tests/blaze: Django's test client
    keeps the test database in one thread.)"""
    big = blaze_url(dataset, "img8", (0, 64), (0, 64), (0, 4))
    small = blaze_url(dataset, "img8", (16, 32), (16, 32), (1, 3))
    assert post_blosc(admin, big, np.full((4, 64, 64), 1, np.uint8)).status_code == 201
    assert post_blosc(admin, small, np.full((2, 16, 16), 2, np.uint8)).status_code == 201
    expected = np.full((4, 64, 64), 1, np.uint8)
    expected[1:3, 16:32, 16:32] = 2
    assert np.array_equal(get_array(admin, big, expected.shape, "uint8"), expected)
    merge_via_daemon()
    assert np.array_equal(get_array(admin, dataset.cutout("img8", 0, (0, 64), (0, 64), (0, 4)), expected.shape,
                                    "uint8"), expected)


@pytest.mark.parametrize("body, content_type, message", [
    (b"\0" * 7, "application/octet-stream", "needs"),
    (b"abc", "application/blosc", "blosc"),
    (b"", "application/blosc", "empty"),
])
def test_bad_blaze_bodies_are_400_and_store_nothing(admin: APIClient, dataset: Dataset, body: bytes,
                                                    content_type: str, message: str) -> None:
    r = admin.generic("POST", blaze_url(dataset, "img8", (0, 8), (0, 8), (0, 2)), body, content_type=content_type)
    assert r.status_code == 400 and message in r.json()["message"]
    assert services().blaze_buffer.stats().blobs == 0


def test_blaze_needs_write_permission_and_merges_need_staff(dataset: Dataset, grant: Any) -> None:
    reader = grant("reader", dataset.collection, "read")
    writer = grant("writer", dataset.collection, "write")
    url = blaze_url(dataset, "img8", (0, 8), (0, 8), (0, 2))
    data = np.ones((2, 8, 8), np.uint8)
    assert post_blosc(APIClient(), url, data).status_code == 401
    assert post_blosc(reader, url, data).status_code == 403
    assert post_blosc(writer, url, data).status_code == 201
    assert writer.post("/v1/blaze/merge/").status_code == 403
    assert APIClient().get("/v1/blaze/merge/").status_code == 401
    assert writer.get("/v1/blaze/merge/nope/").status_code == 404


def test_a_full_buffer_answers_503_with_retry_after(admin: APIClient, dataset: Dataset,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NDSTORE_BLAZE_MAX_PENDING_BYTES", "1000")
    services.cache_clear()
    url = blaze_url(dataset, "img8", (0, 30), (0, 30), (0, 1))
    first, second = np.random.default_rng(1).integers(0, 255, (2, 1, 30, 30), dtype=np.uint8)  # 900 bytes each
    assert post_blosc(admin, url, first).status_code == 201
    r = post_blosc(admin, url, second)
    assert r.status_code == 503 and int(r["Retry-After"]) > 0
    assert "NDBlaze buffer" in r.json()["message"]
    assert np.array_equal(get_array(admin, url, (1, 30, 30), "uint8"), first)  # the refused write left no trace


def test_deleting_a_channel_drops_its_pending_blaze_writes(admin: APIClient, dataset: Dataset) -> None:
    keep = blaze_url(dataset, "img8", (0, 16), (0, 16), (0, 2))
    assert post_blosc(admin, keep, np.full((2, 16, 16), 4, np.uint8)).status_code == 201
    assert post_blosc(admin, blaze_url(dataset, "f32", (0, 16), (0, 16), (0, 2)),
                      np.ones((2, 16, 16), np.float32)).status_code == 201
    r = admin.delete(f"/v1/collection/{dataset.collection}/experiment/{dataset.experiment}/channel/f32/")
    assert r.status_code == 204
    buffer = services().blaze_buffer
    stats = buffer.stats()
    assert (stats.blobs, stats.supercuboids) == (1, 1)  # img8's write only
    merge_via_daemon()
    assert (get_array(admin, keep, (2, 16, 16), "uint8") == 4).all()
