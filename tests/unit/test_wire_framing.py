"""The cheap framing checks the NDBlaze write path relies on: every format accepts its own
encoding of the right box and refuses one of another size, without inflating the body."""

from __future__ import annotations

import numpy as np
import pytest

from ndstore.core import wire
from ndstore.core.errors import InvalidBody

SHAPE = (3, 20, 30)


@pytest.mark.parametrize("media_type", list(wire.FORMATS))
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint64", "float32"])
def test_own_encoding_passes_and_decodes(media_type: str, dtype: str) -> None:
    fmt = wire.FORMATS[media_type]
    data = np.arange(np.prod(SHAPE)).astype(dtype).reshape(SHAPE)
    body = fmt.encode(data)
    fmt.check_framing(body, SHAPE, np.dtype(dtype))
    assert np.array_equal(fmt.decode(body, SHAPE, np.dtype(dtype)), data)


@pytest.mark.parametrize("media_type", ["application/blosc", "application/blosc-python", "application/octet-stream"])
def test_another_box_size_is_refused(media_type: str) -> None:
    """(blosc-python's check allows for the pickle's own bytes: only sizes well off are caught
    before the full decode.)"""
    fmt = wire.FORMATS[media_type]
    body = fmt.encode(np.zeros((3, 20, 31 if media_type != "application/blosc-python" else 130), np.uint16))
    with pytest.raises(InvalidBody):
        fmt.check_framing(body, SHAPE, np.dtype("uint16"))


def test_truncated_blosc_is_refused() -> None:
    body = wire.FORMATS["application/blosc"].encode(np.random.default_rng(0).integers(0, 9, SHAPE, dtype=np.uint8))
    with pytest.raises(InvalidBody, match="compressed bytes"):
        wire.FORMATS["application/blosc"].check_framing(body[:-3], SHAPE, np.dtype("uint8"))


@pytest.mark.parametrize("body", [b"", b"x", b"PK\x03\x04", b"\x78\x00"])
def test_npygz_needs_a_zlib_or_gzip_header(body: bytes) -> None:
    with pytest.raises(InvalidBody, match="header"):
        wire.FORMATS["application/npygz"].check_framing(body, SHAPE, np.dtype("uint8"))
