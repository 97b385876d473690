"""The attacker (or the buggy client) whose write is acknowledged and then dropped: 201 means
the write will be applied, on every tier (DESIGN §9).

NDBlaze stored bodies after a cheap framing check and answered 201; at merge time the ones that
did not decode (an npygz body whose .npy header has another dtype, a zlib stream that is not
.npy) were set aside and never applied, while the cache tier and direct I/O refused the same
bodies with 400. Now every tier refuses them before answering, and a body NDBlaze acknowledges
is one its merge applies."""

from __future__ import annotations

import io
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from ndstore.core import wire
from ndstore.core.errors import InvalidRequest
from ndstore.core.geometry import Box
from ndstore.engine.volume import Cutout
from tests.api.conftest import Dataset
from tests.blaze.conftest import Blaze, blaze  # noqa: F401  (fixture)
from tests.engine.conftest import small_channel
from tests.fuzz.test_decoders import mutate

SHAPE = (4, 16, 16)
TIERS = ["cutout", "direct/cutout", "blaze/cutout"]


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def refused_bodies() -> dict[str, tuple[str, bytes]]:
    data = np.arange(np.prod(SHAPE), dtype=np.uint16).reshape(SHAPE)
    blosc_body = wire.FORMATS["application/blosc"].encode(data)
    npygz_body = wire.FORMATS["application/npygz"].encode(data)
    return {
        "npygz of another dtype": ("application/npygz", zlib.compress(_npy(data.astype(np.uint8)))),
        "zlib that is not npy": ("application/npygz", zlib.compress(b"\0" * data.nbytes)),
        "npygz cut after its header": ("application/npygz", npygz_body[: len(npygz_body) // 2]),
        "npygz with a bad checksum": ("application/npygz", npygz_body[:-4] + b"\0\0\0\0"),
        "npygz of another shape": ("application/npygz", zlib.compress(_npy(data.reshape(4, 8, 32)))),
        "blosc with a corrupt block": ("application/blosc", blosc_body[:40] + bytes(len(blosc_body) - 40)),
        "blosc-python of another dtype": ("application/blosc-python",
                                          wire.FORMATS["application/blosc-python"].encode(data.astype(np.uint32)[:2])),
        "raw of another size": ("application/octet-stream", data.tobytes()[:-2]),
    }


@pytest.mark.parametrize("case", sorted(refused_bodies()))
def test_every_tier_refuses_what_any_tier_refuses(admin: APIClient, dataset: Dataset, case: str) -> None:
    media, body = refused_bodies()[case]
    from ndstore.wiring import services

    for tier in TIERS:
        r = admin.generic("POST", f"/v1/{tier}/c1/e1/img16/0/0:16/0:16/0:4/", body, content_type=media)
        assert r.status_code == 400, (tier, r.status_code, r.content)
    assert services().blaze_buffer.stats().blobs == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.data(), st.sampled_from(sorted(wire.FORMATS)))
def test_what_ndblaze_acknowledges_it_applies(blaze: Blaze, data: Any, media: str) -> None:  # noqa: F811
    """Any body, valid or mutated: NDBlaze acknowledges exactly what the cache tier's decoder
    accepts, and after a merge the base tier holds exactly what it decoded to."""
    channel = small_channel("uint16")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (16, 16, 4)), range(1))
    array = np.random.default_rng(data.draw(st.integers(0, 1 << 30))).integers(1, 60000, SHAPE, dtype=np.uint16)
    body = wire.FORMATS[media].encode(array)
    if data.draw(st.booleans()):
        body = mutate(data.draw, body)
    try:
        decoded = wire.FORMATS[media].decode(body, SHAPE, np.dtype(np.uint16))
    except InvalidRequest:
        decoded = None
    try:
        blaze.tier.write_body(cutout, body, media, has_time=False)
        acknowledged = True
    except InvalidRequest:
        acknowledged = False
    assert acknowledged == (decoded is not None)
    if acknowledged:
        result = blaze.merger.merge(blaze.buffer.pending_names())
        assert result.supercuboids_failed == 0 and blaze.buffer.stats().blobs == 0
        assert np.array_equal(blaze.base.read(cutout)[0], decoded)
