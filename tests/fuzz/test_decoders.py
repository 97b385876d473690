"""Property tests of every decoder of a request body (ndstore.core.wire's four media types with
`validate`, the complete check the NDBlaze write path runs before it stores a body undecoded,
and the ingest's tile decoder):

- a valid body decodes back to exactly the array it encodes;
- arbitrary bytes, and valid bodies flipped, cut, padded or with forged headers, either decode to
  an array of exactly the box's shape and dtype or raise InvalidRequest (InvalidBody) — never
  another exception;
- no body makes a decoder allocate more than the box it declares: blosc headers and .npy
  headers that claim huge sizes, zlib bombs, images that claim huge dimensions.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import blosc
import blosc2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import ImageFile

from ndstore.core import tiles, wire
from ndstore.core.errors import InvalidBody, InvalidRequest

MEDIA_TYPES = sorted(wire.FORMATS)
DTYPES = [np.dtype(d) for d in ("uint8", "uint16", "uint32", "uint64", "float32")]
SCALE = float(os.environ.get("NDSTORE_FUZZ_SCALE", "1"))  # e.g. 20 for a long hunt; 1 in the test suite
FAST = settings(max_examples=int(500 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
TRACED = settings(max_examples=int(80 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLACK = 1 << 20  # bookkeeping a decoder may allocate beyond the box itself (pickle, headers)


def shapes() -> st.SearchStrategy[tuple[int, ...]]:
    """(z, y, x) boxes, or (t, z, y, x) ones."""
    return st.lists(st.integers(1, 9), min_size=3, max_size=4).map(tuple)


@st.composite
def arrays(draw: Any) -> np.ndarray:
    array: np.ndarray = draw(hnp.arrays(draw(st.sampled_from(DTYPES)), draw(shapes())))  # with NaN, inf, -0.0
    return array


@st.composite
def encoded(draw: Any) -> tuple[str, np.ndarray, bytes]:
    media = draw(st.sampled_from(MEDIA_TYPES))
    array = draw(arrays())
    return media, array, wire.format_for(media).encode(array)


def mutate(draw: Any, body: bytes) -> bytes:
    """A valid body flipped, cut, padded, spliced or with a header field forged."""
    out = bytearray(body)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "pad", "splice", "field"]))
        if kind == "flip" and out:
            i = draw(st.integers(0, len(out) - 1))
            out[i] ^= draw(st.integers(1, 255))
        elif kind == "cut" and out:
            del out[draw(st.integers(0, len(out) - 1)):]
        elif kind == "pad":
            out += draw(st.binary(min_size=1, max_size=32))
        elif kind == "splice" and out:
            i = draw(st.integers(0, len(out) - 1))
            out[i:i + 4] = draw(st.binary(min_size=0, max_size=8))
        elif kind == "field" and len(out) >= 16:  # a blosc header's nbytes, blocksize or cbytes
            offset = draw(st.sampled_from([4, 8, 12]))
            out[offset:offset + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1,
                                                                              len(out), 2 * len(out)])))
    return bytes(out)


def decode_or_refuse(media: str, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """The decoded array (checked against the box), or None when the decoder refused the body
    with InvalidRequest; anything else it raises fails the test."""
    fmt = wire.format_for(media)
    try:
        fmt.validate(body, shape, dtype)
        valid = True
    except InvalidRequest:
        valid = False
    try:
        out = fmt.decode(body, shape, dtype)
    except InvalidRequest:
        assert not valid, "validate passed a body that decode refuses"
        return None
    assert valid, "validate refused a body that decodes"
    assert out.shape == shape and out.dtype == dtype
    return out


@contextmanager
def allocation_cap(limit: int) -> Iterator[None]:
    """Fail when the block allocates more than `limit` bytes at its peak (numpy's buffers and
    Python objects; tracemalloc sees both)."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"peak allocation {peak} bytes, over the cap of {limit}"


def nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape)) * dtype.itemsize


# --- the wire formats -----------------------------------------------------------------------

@FAST
@given(encoded())
def test_valid_bodies_round_trip_exactly(case: tuple[str, np.ndarray, bytes]) -> None:
    media, array, body = case
    fmt = wire.format_for(media)
    fmt.validate(body, array.shape, array.dtype)
    out = fmt.decode(body, array.shape, array.dtype)
    assert out.shape == array.shape and out.dtype == array.dtype
    assert out.tobytes() == array.tobytes()  # bit for bit: NaN payloads and -0.0 included


@FAST
@given(st.sampled_from(MEDIA_TYPES), st.binary(max_size=512), shapes(), st.sampled_from(DTYPES))
def test_arbitrary_bytes_decode_to_the_box_or_are_refused(media: str, body: bytes, shape: tuple[int, ...],
                                                          dtype: np.dtype) -> None:
    decode_or_refuse(media, body, shape, dtype)


@FAST
@given(st.data(), encoded())
def test_mutated_bodies_decode_to_the_box_or_are_refused(data: Any, case: tuple[str, np.ndarray, bytes]) -> None:
    media, array, body = case
    decode_or_refuse(media, mutate(data.draw, body), array.shape, array.dtype)


@FAST
@given(st.data(), encoded(), shapes(), st.sampled_from(DTYPES))
def test_bodies_for_another_box_are_refused(data: Any, case: tuple[str, np.ndarray, bytes], shape: tuple[int, ...],
                                            dtype: np.dtype) -> None:
    """A valid body of another size or dtype never decodes into this box (byte counts that
    happen to match are the one exception: raw bytes carry no shape)."""
    media, array, body = case
    if array.nbytes == nbytes(shape, dtype) and media in ("application/octet-stream", "application/blosc"):
        return
    if array.shape == shape and array.dtype == dtype:
        return
    assert decode_or_refuse(media, body, shape, dtype) is None


@FAST
@given(st.data(), encoded())
def test_what_ndblaze_acknowledges_its_merge_decodes(data: Any, case: tuple[str, np.ndarray, bytes]) -> None:
    """NDBlaze stores bodies that pass validate and decodes them at merge time: a body that
    passes must decode to the box (201 means it will be applied), within bounded memory."""
    media, array, body = case
    body = mutate(data.draw, body) if data.draw(st.booleans()) else body
    fmt = wire.format_for(media)
    with allocation_cap(3 * array.nbytes + SLACK):
        try:
            fmt.validate(body, array.shape, array.dtype)
        except InvalidRequest:
            return
    out = fmt.decode(body, array.shape, array.dtype)
    assert out.shape == array.shape and out.dtype == array.dtype


# --- decompression bombs --------------------------------------------------------------------

def _blosc_claiming(claim: int, body: bytes) -> bytes:
    """A blosc (1.x format) body whose header claims `claim` decompressed bytes."""
    out = bytearray(body)
    out[4:8] = struct.pack("<I", claim)
    return bytes(out)


@TRACED
@given(st.sampled_from(["application/blosc", "application/blosc-python"]), arrays(),
       st.integers(2**20, 2**31 - 1))
def test_blosc_headers_claiming_huge_sizes_are_refused_before_inflating(media: str, array: np.ndarray,
                                                                        claim: int) -> None:
    body = _blosc_claiming(claim, wire.format_for(media).encode(array))
    with allocation_cap(2 * array.nbytes + SLACK):
        assert decode_or_refuse(media, body, array.shape, array.dtype) is None


@TRACED
@given(arrays(), st.sampled_from([64 << 20, 256 << 20]), st.sampled_from(["blosc", "blosc2"]))
def test_real_blosc_bombs_are_refused_before_inflating(array: np.ndarray, size: int, codec: str) -> None:
    zeros = np.zeros(size, np.uint8)
    body = blosc.compress(zeros, typesize=1) if codec == "blosc" else blosc2.compress(zeros, typesize=1)
    del zeros
    for media in ("application/blosc", "application/blosc-python"):
        with allocation_cap(2 * array.nbytes + SLACK):
            assert decode_or_refuse(media, body, array.shape, array.dtype) is None


def _npy(header_shape: tuple[int, ...], descr: str, payload: bytes, fortran: bool = False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran, "shape": header_shape})
    return buf.getvalue() + payload


@TRACED
@given(arrays(), st.lists(st.integers(1, 10**6), min_size=1, max_size=4).map(tuple),
       st.sampled_from(["|u1", "<u2", "<u8", "<f4", "<f8", "|O"]), st.binary(max_size=64),
       st.sampled_from(["zlib", "gzip"]))
def test_npy_headers_claiming_huge_shapes_are_refused_before_allocating(
        array: np.ndarray, claimed: tuple[int, ...], descr: str, payload: bytes, wrapper: str) -> None:
    raw = _npy(claimed, descr, payload)
    body = zlib.compress(raw) if wrapper == "zlib" else _gzip(raw)
    with allocation_cap(3 * array.nbytes + SLACK):
        out = decode_or_refuse("application/npygz", body, array.shape, array.dtype)
    assert out is None or (claimed == array.shape and np.dtype(descr) == array.dtype)


@functools.cache
def _zlib_bomb(size: int, wbits: int) -> bytes:
    """A .npy file of `size` zero bytes, deflated (about 1000:1)."""
    compressor, chunk = zlib.compressobj(9, wbits=wbits), bytes(1 << 20)
    parts = [compressor.compress(_npy((size,), "|u1", b""))]
    parts += [compressor.compress(chunk) for _ in range(size >> 20)]
    return b"".join(parts) + compressor.flush()


@TRACED
@given(arrays(), st.sampled_from([16 << 20, 256 << 20]), st.sampled_from([15, 31]))
def test_zlib_bombs_stop_inflating_at_the_box(array: np.ndarray, size: int, wbits: int) -> None:
    body = _zlib_bomb(size, wbits)  # zlib (15) or gzip (31)
    with allocation_cap(3 * array.nbytes + SLACK + 4096):
        assert decode_or_refuse("application/npygz", body, array.shape, array.dtype) is None


def _gzip(raw: bytes) -> bytes:
    c = zlib.compressobj(wbits=31)
    return c.compress(raw) + c.flush()


@FAST
@given(arrays(), st.sampled_from(["zlib", "gzip"]), st.booleans())
def test_npygz_accepts_zlib_gzip_and_fortran_order(array: np.ndarray, wrapper: str, fortran: bool) -> None:
    """What numpy.save writes, in either wrapper and either order, decodes to the same array."""
    raw = io.BytesIO()
    np.save(raw, np.asfortranarray(array) if fortran else array, allow_pickle=False)
    body = zlib.compress(raw.getvalue()) if wrapper == "zlib" else _gzip(raw.getvalue())
    out = wire.format_for("application/npygz").decode(body, array.shape, array.dtype)
    assert out.tobytes() == array.tobytes()


@TRACED
@given(arrays(), st.lists(st.integers(1, 10**5), min_size=1, max_size=4).map(tuple))
def test_pickles_claiming_huge_shapes_are_refused(array: np.ndarray, claimed: tuple[int, ...]) -> None:
    """blosc-python bodies are pickles: one whose array claims another shape than its data holds
    (or than the box) is refused, without allocating for the claim."""
    forged = pickle.dumps(_Forged((1, claimed, array.dtype, False, array.tobytes())), protocol=2)
    body = blosc.compress(forged + bytes(max(0, array.nbytes - len(forged))), typesize=1)
    with allocation_cap(3 * array.nbytes + SLACK + len(forged)):
        out = decode_or_refuse("application/blosc-python", body, array.shape, array.dtype)
    assert out is None or claimed == array.shape


PICKLE_BOMBS = {  # each a few bytes that make a plain unpickler allocate gigabytes
    "memo index": b"\x80\x04N" + b"r" + struct.pack("<I", 2**26) + b".",
    "bytearray8 count": b"\x80\x05\x96" + struct.pack("<Q", 2**30) + b"xx.",
    "ndarray called": b"\x80\x04\x8c\x05numpy\x8c\x07ndarray\x93J" + struct.pack("<i", 10**9) + b"\x85R.",
    "reconstruct shape": (b"\x80\x04\x8c\x16numpy._core.multiarray\x8c\x0c_reconstruct\x93\x8c\x05numpy\x8c\x07"
                          b"ndarray\x93J" + struct.pack("<i", 10**9) + b"\x85C\x01b\x87R."),
}


@pytest.mark.parametrize("bomb", sorted(PICKLE_BOMBS))
def test_pickle_bombs_are_refused_before_allocating(bomb: str) -> None:
    shape, dtype = (4, 30, 40), np.dtype(np.uint8)
    pickled = PICKLE_BOMBS[bomb]
    body = blosc.compress(pickled + bytes(nbytes(shape, dtype) - len(pickled)), typesize=1)
    with allocation_cap(3 * nbytes(shape, dtype) + SLACK):
        assert decode_or_refuse("application/blosc-python", body, shape, dtype) is None


@FAST
@given(arrays(), st.sampled_from([3, 4, 5]), st.booleans())
def test_pickles_of_any_protocol_and_order_round_trip(array: np.ndarray, protocol: int, fortran: bool) -> None:
    body = blosc.compress(pickle.dumps(np.asfortranarray(array) if fortran else array, protocol), typesize=1)
    out = wire.format_for("application/blosc-python").decode(body, array.shape, array.dtype)
    assert out.tobytes() == array.tobytes()


class _Forged:
    """Pickles as ndarray reconstruction with a state of our choosing."""

    def __init__(self, state: tuple[Any, ...]):
        self.state = state

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...], tuple[Any, ...]]:
        from numpy._core.multiarray import _reconstruct

        return _reconstruct, (np.ndarray, (0,), b"b"), self.state


# --- ingest tiles ---------------------------------------------------------------------------

TILE_MODES = {"L": np.uint8, "I;16": np.uint16}


@st.composite
def tile_images(draw: Any) -> tuple[bytes, tuple[int, int], np.ndarray]:
    mode = draw(st.sampled_from(sorted(TILE_MODES)))
    shape = (draw(st.integers(1, 24)), draw(st.integers(1, 24)))
    pixels = draw(hnp.arrays(TILE_MODES[mode], shape))
    file_format = draw(st.sampled_from(["png", "tif"]))
    return tiles.encode_tile(pixels, file_format), shape, pixels


@contextmanager
def loaded_pixels() -> Iterator[list[int]]:
    """The pixel counts of the images PIL decodes inside the block."""
    counts: list[int] = []
    load = ImageFile.ImageFile.load

    def counting(image: Any) -> Any:
        counts.append(image.size[0] * image.size[1])
        return load(image)

    ImageFile.ImageFile.load = counting  # type: ignore[method-assign, assignment]
    try:
        yield counts
    finally:
        ImageFile.ImageFile.load = load  # type: ignore[method-assign]


def decode_tile_or_refuse(body: bytes, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray | None:
    try:
        out = tiles.decode_tile(body, "tile", shape, shape, dtype)
    except InvalidRequest:
        return None
    assert out.shape == shape and out.dtype == dtype
    return out


@FAST
@given(tile_images())
def test_valid_tiles_round_trip_exactly(tile: tuple[bytes, tuple[int, int], np.ndarray]) -> None:
    body, shape, pixels = tile
    out = tiles.decode_tile(body, "tile", shape, shape, pixels.dtype)
    np.testing.assert_array_equal(out, pixels)


@FAST
@pytest.mark.filterwarnings("ignore::UserWarning:PIL")  # PIL's notes on corrupt TIFF tags
@given(st.data(), tile_images(), st.sampled_from(DTYPES[:2]))
def test_mutated_tiles_decode_to_the_tile_or_are_refused(data: Any, tile: tuple[bytes, tuple[int, int], np.ndarray],
                                                         dtype: np.dtype) -> None:
    body, shape, _ = tile
    with loaded_pixels() as counts:
        decode_tile_or_refuse(mutate(data.draw, body), shape, dtype)
    assert all(n <= shape[0] * shape[1] for n in counts), counts


def _png_claiming(width: int, height: int, mode: str = "L") -> bytes:
    """A small PNG whose IHDR claims width x height (its pixels are zeros, deflated)."""
    depth, colour = (8, 0) if mode == "L" else (16, 0)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    row = bytes(1 + width * depth // 8)
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(min(height, 64))) + compressor.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@TRACED
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # PIL's, on opening: we refuse next
@given(st.integers(2000, 30000), st.integers(2000, 30000), st.sampled_from(["L", "I;16"]))
def test_tiles_claiming_huge_dimensions_are_refused_before_decoding(width: int, height: int, mode: str) -> None:
    body = _png_claiming(width, height, mode)
    shape = (512, 512)
    with loaded_pixels() as counts:
        assert decode_tile_or_refuse(body, shape, np.dtype(TILE_MODES[mode])) is None
    assert all(n <= shape[0] * shape[1] for n in counts), f"decoded {counts} pixels for a 512x512 tile"


def test_a_broken_png_chunk_is_an_invalid_tile() -> None:
    """Pillow raises SyntaxError on a broken chunk (found by the fuzzer); it is an InvalidBody."""
    body = bytearray(tiles.encode_tile(np.zeros((8, 8), np.uint16), "png"))
    body[46:50] = b"\x00"
    with pytest.raises(InvalidBody, match="not a readable PNG/TIFF image: broken PNG file"):
        tiles.decode_tile(bytes(body), "tile", (8, 8), (8, 8), np.dtype(np.uint16))


@FAST
@given(st.binary(max_size=256), st.sampled_from(DTYPES[:2]))
def test_arbitrary_bytes_are_not_tiles(body: bytes, dtype: np.dtype) -> None:
    decode_tile_or_refuse(body, (8, 8), dtype)


@pytest.mark.parametrize("media", MEDIA_TYPES)
def test_an_empty_body_is_refused(media: str) -> None:
    with pytest.raises(InvalidBody):
        wire.format_for(media).decode(b"", (1, 1, 1), np.dtype(np.uint8))
