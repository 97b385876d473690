"""No corruption from hostile cutout writes, through the API and the real tiers: valid bodies and
flipped, cut, padded or forged ones, in every media type, into the cache tier, the base tier
(direct) and the NDBlaze buffer.

A numpy model of each channel's region is checked after every write: a refused write (4xx)
leaves the stored voxels as they were; an accepted one stores exactly what the body decodes to
(NDBlaze accepts a body on its framing alone, and its reads skip one that does not decode: there,
either is allowed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from rest_framework.test import APIClient

from ndstore.core import wire
from ndstore.core.errors import InvalidRequest
from tests.api.conftest import admin, make_dataset  # noqa: F401  (a fixture)
from tests.fuzz.test_decoders import SCALE, mutate

REGION = (4, 24, 32)  # z, y, x at the frame's origin, resolution 0
TIERS = {"cache": "/v1/cutout", "direct": "/v1/direct/cutout", "blaze": "/v1/blaze/cutout"}
DTYPES: dict[str, np.dtype[Any]] = {"8": np.dtype(np.uint8), "16": np.dtype(np.uint16), "f": np.dtype(np.float32)}
WRITES = settings(max_examples=int(120 * SCALE), deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture
def channels(wired: None, admin: APIClient) -> APIClient:  # noqa: F811
    """c1/e1 with a channel per tier and datatype (`cache8`, `blaze16`, ...), each empty."""
    make_dataset(admin, name="c1", frame=(64, 64, 16),
                 channels={f"{tier}{suffix}": dtype.name for tier in TIERS for suffix, dtype in DTYPES.items()})
    return admin


def _url(tier: str, channel: str, lo: tuple[int, int, int], hi: tuple[int, int, int]) -> str:
    (z0, y0, x0), (z1, y1, x1) = lo, hi
    return f"{TIERS[tier]}/c1/e1/{channel}/0/{x0}:{x1}/{y0}:{y1}/{z0}:{z1}/"


def _read_region(client: APIClient, tier: str, channel: str, dtype: np.dtype) -> np.ndarray:
    r = client.get(_url(tier, channel, (0, 0, 0), REGION), HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 200, r.content
    return np.frombuffer(r.content, dtype).reshape(REGION)


@st.composite
def writes(draw: Any) -> tuple[str, str, str, tuple[int, int, int], tuple[int, int, int], np.ndarray]:
    tier = draw(st.sampled_from(sorted(TIERS)))
    suffix = draw(st.sampled_from(sorted(DTYPES)))
    lo = tuple(draw(st.integers(0, n - 1)) for n in REGION)
    hi = tuple(draw(st.integers(a + 1, n)) for a, n in zip(lo, REGION))
    shape = tuple(b - a for a, b in zip(lo, hi))
    data = draw(hnp.arrays(DTYPES[suffix], shape, elements=hnp.from_dtype(DTYPES[suffix], allow_nan=False)))
    return tier, f"{tier}{suffix}", draw(st.sampled_from(sorted(wire.FORMATS))), lo, hi, data


@WRITES
@given(data=st.data(), write=writes())
def test_refused_writes_change_nothing_and_accepted_ones_store_exactly_the_body(
        channels: APIClient, data: Any, write: tuple[str, str, str, Any, Any, np.ndarray]) -> None:
    tier, channel, media, lo, hi, array = write
    dtype = array.dtype
    before = _read_region(channels, tier, channel, dtype)
    body = wire.format_for(media).encode(array)
    if data.draw(st.integers(0, 2)):
        body = mutate(data.draw, body)
    r = channels.generic("POST", _url(tier, channel, lo, hi), body, content_type=media)
    assert r.status_code in (201, 400, 413), (r.status_code, r.content[:300])
    after = _read_region(channels, tier, channel, dtype)
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    if r.status_code != 201:
        assert r.json()["message"]
        np.testing.assert_array_equal(after, before, err_msg=f"a refused write changed {channel}")
        return
    expected = before.copy()
    try:
        expected[box] = wire.format_for(media).decode(body, array.shape, dtype)
    except InvalidRequest:
        assert tier == "blaze", f"{tier} accepted a body that does not decode"  # its reads skip the blob
        expected = before
    np.testing.assert_array_equal(after, expected, err_msg=f"{channel} does not hold what was written")
