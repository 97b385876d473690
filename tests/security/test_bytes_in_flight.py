"""No client, and no crowd of anonymous ones, makes a web worker hold more than its budget of
bytes (ndstore/engine/cost.py): before it, four 1 GiB cutouts at once took one worker to 6 GiB."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from ndstore.core.errors import Busy, PayloadTooLarge
from ndstore.core.geometry import Box
from ndstore.engine import cost
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.wiring import services
from tests.api.conftest import Dataset, make_dataset
from tests.security.conftest import CountingBody, token_for, wsgi

MiB = 1 << 20
SUPERCUBOID = 16 * MiB  # the whole 512x512x16 frame lies in one supercuboid (512x512x64 for uint8)
BOX = "0:512/0:512/0:4/"  # 1 MiB of uint8 in that supercuboid: costs READ_BOX of the budget, a write WRITE_BOX
READ_BOX = 2 * MiB + SUPERCUBOID  # the array, its answer and the supercuboid's stored object
WRITE_BOX = 4 * MiB + 3 * SUPERCUBOID  # ... and the supercuboid read whole, its stored object and its new one
TOTAL, ANONYMOUS = 64 * MiB, READ_BOX + MiB


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[cost.ByteBudget]:
    small = cost.ByteBudget(total=TOTAL, anonymous=ANONYMOUS)
    monkeypatch.setattr(services().plane, "budget", small)
    yield small
    assert small.held == 0, "a finished request kept its reservation"


def test_a_thin_box_costs_the_supercuboids_it_holds_whole() -> None:
    """Its array is small, but each supercuboid it touches is fetched (and for a write, read
    whole and stored again): before, a 64 MiB slab over 16 supercuboids reserved 256 MiB and a
    fresh worker grew by 395 MiB writing it straight to the base tier."""
    frame = Box((0, 0, 0), (2048, 2048, 64))  # 4 x 4 supercuboids of 512x512x64 uint8
    chan = ChannelVolume(1, 1, 1, np.dtype("uint8"), frame, 1, "anisotropic", 1)
    window_bytes = 64 * MiB  # the default: four supercuboids
    window = 4
    slab = Cutout(chan, 0, Box((0, 0, 8), (2048, 2048, 24)), range(1))  # 64 MiB
    assert slab.supercuboids == 16
    assert cost.cost(False, slab.nbytes, slab, window_bytes) == 4 * slab.nbytes + 3 * window * SUPERCUBOID
    assert cost.cost(True, slab.nbytes, slab, window_bytes) == 2 * slab.nbytes + 2 * window * SUPERCUBOID
    plane = Cutout(chan, 0, Box((0, 0, 3), (2048, 2048, 4)), range(1))  # 4 MiB, one voxel deep
    assert cost.cost(True, plane.nbytes, plane, window_bytes) == 2 * plane.nbytes + 8 * SUPERCUBOID  # was 3 x 4 MiB
    voxel = Cutout(chan, 0, Box((5, 5, 5), (6, 6, 6)), range(1))
    assert cost.cost(True, 1, voxel, window_bytes) == 2 + SUPERCUBOID
    assert cost.cost(True, 1, None, window_bytes) == 2  # no supercuboids: what a request holds besides its read


@pytest.fixture
def public(admin: APIClient) -> Dataset:
    data = make_dataset(admin, "pub", frame=(512, 512, 16), levels=1)
    assert admin.put("/v1/collection/pub/", {"public": True}, format="json").status_code == 200
    return data


def test_the_budget_counts_what_is_held_and_refuses_beyond_it() -> None:
    b = cost.ByteBudget(total=10, anonymous=4)
    b.take(4, anonymous=True)
    with pytest.raises(Busy):
        b.take(1, anonymous=True)  # the anonymous share is full
    b.take(6, anonymous=False)
    with pytest.raises(Busy):
        b.take(1, anonymous=False)  # the worker is full
    with pytest.raises(PayloadTooLarge, match="send a token"):
        b.take(5, anonymous=True)  # more than an anonymous request may ever cost
    with pytest.raises(PayloadTooLarge):
        b.take(11, anonymous=False)
    b.give(4, anonymous=True)
    b.give(6, anonymous=False)
    assert b.held == 0
    b.take(10, anonymous=False)


def test_an_anonymous_read_over_its_share_is_413_and_a_token_gets_it(small_budget: cost.ByteBudget,
                                                                      public: Dataset, admin: APIClient) -> None:
    url = "/v1/cutout/pub/e1/img8/0/0:512/0:512/0:8/"  # 2 MiB: READ_BOX + 2 MiB of budget, over the anonymous share
    refused = APIClient().get(url, HTTP_ACCEPT="application/octet-stream")
    assert refused.status_code == 413 and "anonymous" in refused.json()["message"]
    assert "token" in refused.json()["message"]
    ok = admin.get(url, HTTP_ACCEPT="application/octet-stream")
    assert ok.status_code == 200 and len(ok.content) == 2 * MiB
    small = APIClient().get(f"/v1/cutout/pub/e1/img8/0/{BOX}", HTTP_ACCEPT="application/octet-stream")
    assert small.status_code == 200  # READ_BOX: within the anonymous share


@pytest.mark.parametrize("anonymous", [True, False])
def test_a_read_while_the_worker_is_full_is_503_with_retry_after(small_budget: cost.ByteBudget, public: Dataset,
                                                                 admin: APIClient, anonymous: bool) -> None:
    """Other requests in flight hold the budget: the read is refused at once, not queued."""
    client = APIClient() if anonymous else admin
    url = f"/v1/cutout/pub/e1/img8/0/{BOX}"
    held = (ANONYMOUS if anonymous else TOTAL) - READ_BOX + 1
    small_budget.take(held, anonymous)
    try:
        busy = client.get(url, HTTP_ACCEPT="application/octet-stream")
        assert busy.status_code == 503 and busy["Retry-After"] == "1"
        assert "retry" in busy.json()["message"]
    finally:
        small_budget.give(held, anonymous)
    assert client.get(url, HTTP_ACCEPT="application/octet-stream").status_code == 200


def test_a_write_refused_for_the_budget_reads_no_body_and_changes_nothing(small_budget: cost.ByteBudget,
                                                                          public: Dataset, admin: APIClient) -> None:
    _, token = token_for("writer", is_superuser=True)
    held = TOTAL - WRITE_BOX + 1
    small_budget.take(held, False)
    try:
        body = CountingBody(1 * MiB)
        answer = wsgi("POST", f"/v1/cutout/pub/e1/img8/0/{BOX}", body, token=token,
                      content_type="application/octet-stream")
        assert answer.status == 503 and body.read_bytes == 0
    finally:
        small_budget.give(held, False)
    got = admin.get(f"/v1/cutout/pub/e1/img8/0/{BOX}", HTTP_ACCEPT="application/octet-stream")
    assert not np.frombuffer(got.content, np.uint8).any()


@pytest.mark.parametrize("path", ["/v1/image/pub/e1/img8/xy/0/0:512/0:512/2/",
                                  "/precomputed/pub/e1/img8/0/0-512_0-512_0-4"])
def test_slices_and_precomputed_chunks_take_their_share_too(small_budget: cost.ByteBudget, public: Dataset,
                                                            path: str, admin: Any) -> None:
    small_budget.take(TOTAL, False)
    try:
        assert APIClient().get(path).status_code == 503
    finally:
        small_budget.give(TOTAL, False)
    assert APIClient().get(path).status_code == 200


def test_an_ndblaze_write_reserves_its_body_and_no_supercuboids(small_budget: cost.ByteBudget, public: Dataset,
                                                                 admin: APIClient) -> None:
    """NDBlaze buffers the body as it came (the merger applies it elsewhere): 4 x its box, where
    a cache write of the same box also reserves the supercuboid it merges into."""
    held = TOTAL - WRITE_BOX + 1
    body = np.ones((4, 512, 512), np.uint8).tobytes()
    small_budget.take(held, False)
    try:
        cached = admin.post(f"/v1/cutout/pub/e1/img8/0/{BOX}", data=body, content_type="application/octet-stream")
        assert cached.status_code == 503
        buffered = admin.post(f"/v1/blaze/cutout/pub/e1/img8/0/{BOX}", data=body,
                              content_type="application/octet-stream")
        assert buffered.status_code == 201, buffered.content
    finally:
        small_budget.give(held, False)
