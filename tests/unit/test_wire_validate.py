"""`validate`, the check the NDBlaze write path runs before it acknowledges a body it stores
undecoded: every format accepts its own encoding of the right box, and refuses exactly what its
decoder refuses (another box, a truncated or corrupt stream), so what is acknowledged decodes."""

from __future__ import annotations

import zlib

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
    fmt.validate(body, SHAPE, np.dtype(dtype))
    assert np.array_equal(fmt.decode(body, SHAPE, np.dtype(dtype)), data)


@pytest.mark.parametrize("media_type", list(wire.FORMATS))
def test_another_box_size_is_refused(media_type: str) -> None:
    fmt = wire.FORMATS[media_type]
    body = fmt.encode(np.zeros((3, 20, 31), np.uint16))
    with pytest.raises(InvalidBody):
        fmt.validate(body, SHAPE, np.dtype("uint16"))


def test_truncated_blosc_is_refused() -> None:
    body = wire.FORMATS["application/blosc"].encode(np.random.default_rng(0).integers(0, 9, SHAPE, dtype=np.uint8))
    with pytest.raises(InvalidBody, match="compressed bytes"):
        wire.FORMATS["application/blosc"].validate(body[:-3], SHAPE, np.dtype("uint8"))


@pytest.mark.parametrize("body", [b"", b"x", b"PK\x03\x04", b"\x78\x00"])
def test_npygz_needs_a_zlib_or_gzip_stream(body: bytes) -> None:
    with pytest.raises(InvalidBody, match="zlib|npy"):
        wire.FORMATS["application/npygz"].validate(body, SHAPE, np.dtype("uint8"))


def test_npygz_of_another_dtype_or_not_npy_is_refused() -> None:
    """The two bodies NDBlaze once acknowledged and then set aside at merge."""
    fmt = wire.FORMATS["application/npygz"]
    with pytest.raises(InvalidBody, match="dtype"):
        fmt.validate(fmt.encode(np.zeros(SHAPE, np.uint16)), SHAPE, np.dtype("uint8"))
    with pytest.raises(InvalidBody, match=r"\.npy"):
        fmt.validate(zlib.compress(b"\0" * 1800), SHAPE, np.dtype("uint8"))


@pytest.mark.parametrize("cut", [1, 4, 100])
def test_npygz_cut_anywhere_is_refused(cut: int) -> None:
    """validate inflates the whole stream (a window at a time): a cut after the header is caught."""
    fmt = wire.FORMATS["application/npygz"]
    body = fmt.encode(np.random.default_rng(1).integers(0, 255, (8, 256, 256), dtype=np.uint8))
    with pytest.raises(InvalidBody):
        fmt.validate(body[:-cut], (8, 256, 256), np.dtype("uint8"))


@pytest.mark.parametrize("shape_text", ["\u00b0: " * 30, "(" * 5000, "1e999999", "{}", "__import__('os')"])
def test_npygz_with_a_hostile_header_dict_is_refused(shape_text: str) -> None:
    """numpy parses the header with ast.literal_eval, old ones through tokenize; each raises its
    own exception for a hostile header (the fuzzer found a TokenError that became a 500)."""
    header = ("{'descr': '|u1', 'fortran_order': False, 'shape': " + shape_text).encode("latin1")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 1800
    with pytest.raises(InvalidBody, match=r"\.npy"):
        wire.FORMATS["application/npygz"].validate(zlib.compress(npy), SHAPE, np.dtype("uint8"))
