"""Wire formats of cutout bodies, one class per media type, each a pure encode/decode pair.

Every decoder checks the size a body claims before it inflates it (no decompression bombs),
then checks the decoded array's shape and dtype against the box it is written to. No decoder
runs code: a pickled array (`application/blosc-python`) is parsed, never unpickled
(ndstore.core.pickled_array). `validate` makes every check `decode` makes, so a body it passes
always decodes: what NDBlaze acknowledges, its merge can apply.
"""

from __future__ import annotations

import io
import math
import tokenize
import zlib
from typing import Any, ClassVar, Protocol

import blosc
import blosc2
import numpy as np
import numpy.typing as npt

from ndstore.core.chunks import is_blosc1
from ndstore.core.errors import InvalidBody, UnsupportedMediaType
from ndstore.core.pickled_array import array_from_pickle

Array = npt.NDArray[Any]


class WireFormat(Protocol):
    media_type: ClassVar[str]

    def encode(self, array: Array) -> bytes: ...

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array: ...

    def validate(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Every check `decode` makes, without keeping the array: a body that passes decodes.
        The NDBlaze write path stores bodies as they arrived and acknowledges only those."""


def encoded_bound(nbytes: int) -> int:
    """The most bytes a body of an array of ``nbytes`` takes in any of these formats: blosc
    stores an incompressible buffer as it is plus a 16-32 byte header, a pickled array adds its
    framing (at most 4 KiB here), gzip 5 bytes per stored 64 KiB block plus its header."""
    return nbytes + nbytes // 1024 + 65536


def _expected_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _blosc_nbytes(body: bytes) -> int:
    return _blosc_sizes(body)[0]


def _blosc_sizes(body: bytes) -> tuple[int, int]:
    """(nbytes, cbytes) that a blosc header claims; cbytes must be the body's length."""
    try:
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(body)
    except Exception as exc:  # noqa: BLE001 - blosc raises bare RuntimeError/ValueError on a bad header
        raise InvalidBody(f"body is not a blosc buffer: {exc}") from None
    if cbytes != len(body):
        raise InvalidBody(f"blosc header claims {cbytes} compressed bytes, the body holds {len(body)}")
    return int(nbytes), int(cbytes)


# Concurrent requests of one web process (gthread) must not queue behind one body's
# (de)compression: python-blosc holds the GIL by default.
blosc.set_releasegil(True)
# One thread per call: with several, c-blosc places each compressed block where the thread that
# made it finished, so two encodings of the same voxels differed in their block order, and so did
# their strong ETags (a conditional GET re-downloaded; Range reads joined under If-Range could mix
# two layouts). Parallel now across requests (the worker's threads) rather than within one: on
# this 2-core host 16 MiB compress+decompress pairs, 4 threads at once: 59.7/s with 1 blosc thread,
# 59.9/s with 2; one at a time 46.7/s and 51.5/s (docs/design/serving.md, "Encoding the answer").
blosc.set_nthreads(1)
# An answer is compressed once per read and thrown away (stored cuboids are level 1 too, chunks.py):
# level 1 takes half the CPU of level 5 on EM voxels (16 MiB: 5.6 against 10.4 ms) for the same
# size (0.887 against 0.885 of raw); labels and smooth voxels, which compress to 1-4% at either
# level, come out up to 1.5x larger, still a few percent of raw (docs/design/serving.md,
# "Encoding the answer").
ANSWER_CLEVEL = 1


def _blosc_decompress_into(body: bytes, out: Array) -> None:
    try:
        # python-blosc (c-blosc 1.x) decodes 16 MiB bodies about 10x faster here than blosc2 with
        # its default threads; blosc2 is kept for chunks only it can read (format version 3 and up)
        if is_blosc1(body):
            blosc.decompress_ptr(body, out.ctypes.data)
        else:
            blosc2.decompress2(body, dst=out)
    except Exception as exc:  # noqa: BLE001 - whatever blosc says of a client's bytes, they are refused
        raise InvalidBody(f"blosc body is corrupt: {exc}") from None


def _blosc_decompress(body: bytes, nbytes: int) -> Array:
    out = np.empty(nbytes, np.uint8)
    _blosc_decompress_into(body, out)
    return out


def _check_array(array: Array, shape: tuple[int, ...], dtype: np.dtype) -> Array:
    if array.dtype != dtype:
        raise InvalidBody(f"body has dtype {array.dtype}, the channel stores {dtype}")
    if array.shape != shape:
        raise InvalidBody(f"body has shape {array.shape}, the box needs {shape}")
    return array


def _raw_to_array(raw: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
    expected = _expected_nbytes(shape, dtype)
    if len(raw) != expected:
        raise InvalidBody(
            f"body holds {len(raw)} bytes, the box {shape} of {dtype} needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


class BloscFormat:
    """`application/blosc`: blosc-compressed C-order bytes (readable by python-blosc 1.x)."""

    media_type: ClassVar[str] = "application/blosc"

    def encode(self, array: Array) -> bytes:
        data = np.ascontiguousarray(array)
        return blosc.compress(data, typesize=data.dtype.itemsize, cname="lz4",  # type: ignore[no-any-return]
                              clevel=ANSWER_CLEVEL)

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        expected = _expected_nbytes(shape, dtype)
        claimed = _blosc_nbytes(body)
        if claimed != expected:
            raise InvalidBody(f"blosc body holds {claimed} bytes, the box {shape} of {dtype} needs {expected}")
        out = np.empty(shape, dtype)
        _blosc_decompress_into(body, out)  # blosc's own checks of every block
        return out

    def validate(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.decode(body, shape, dtype)


class BloscPythonFormat:
    """`application/blosc-python`: python-blosc's ``pack_array`` (a pickled array, compressed)."""

    media_type: ClassVar[str] = "application/blosc-python"
    _PICKLE_OVERHEAD = 4096

    def encode(self, array: Array) -> bytes:
        return blosc.pack_array(np.ascontiguousarray(array), cname="lz4")  # type: ignore[no-any-return]

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        claimed, expected = _blosc_nbytes(body), _expected_nbytes(shape, dtype)
        if not expected <= claimed <= expected + self._PICKLE_OVERHEAD:
            raise InvalidBody(f"blosc-python body holds {claimed} bytes, not a pickled {shape} {dtype} array")
        array = array_from_pickle(_blosc_decompress(body, claimed))  # parsed, never unpickled
        return _check_array(array, shape, dtype)

    def validate(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.decode(body, shape, dtype)


class NpygzFormat:
    """`application/npygz`: ``numpy.save`` output, zlib- (or gzip-) compressed."""

    media_type: ClassVar[str] = "application/npygz"
    _HEADER_ALLOWANCE = 4096

    def encode(self, array: Array) -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        return zlib.compress(buf.getbuffer(), 1)

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        inflater = zlib.decompressobj(wbits=47)  # zlib or gzip header, detected
        raw = _inflate(inflater, body, _expected_nbytes(shape, dtype) + self._HEADER_ALLOWANCE)
        _check_stream_end(inflater, shape, dtype)
        offset, fortran_order = _npy_header(raw, shape, dtype)
        _check_npy_data(len(raw) - offset, shape, dtype)
        array = np.frombuffer(raw, dtype=dtype, count=math.prod(shape), offset=offset)
        return array.reshape(shape, order="F" if fortran_order else "C")

    def validate(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """The header, then the whole stream inflated a window at a time and counted, not kept
        (the zlib/gzip checksum at its end is checked as the stream ends)."""
        inflater = zlib.decompressobj(wbits=47)
        head = _inflate(inflater, body, self._HEADER_ALLOWANCE)
        offset, _ = _npy_header(head, shape, dtype)
        room = _expected_nbytes(shape, dtype) + offset - len(head)  # what the rest may inflate to
        while not inflater.eof and room >= 0:
            out = _inflate(inflater, inflater.unconsumed_tail, min(room + 1, self._WINDOW))
            if not out and not inflater.unconsumed_tail:
                break  # all input read, no more output: a truncated stream
            room -= len(out)
        _check_stream_end(inflater, shape, dtype)
        _check_npy_data(_expected_nbytes(shape, dtype) - room, shape, dtype)

    _WINDOW = 1 << 20


def _inflate(inflater: Any, data: bytes, limit: int) -> bytes:
    try:
        return inflater.decompress(data, max(1, limit))  # type: ignore[no-any-return]
    except zlib.error as exc:
        raise InvalidBody(f"npygz body is not zlib/gzip data: {exc}") from None


def _check_stream_end(inflater: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if inflater.unconsumed_tail:
        raise InvalidBody(f"npygz body inflates past the {shape} {dtype} box")
    if not inflater.eof:
        raise InvalidBody("npygz body is truncated: its zlib/gzip stream does not end")
    if inflater.unused_data:
        raise InvalidBody(f"npygz body has {len(inflater.unused_data)} bytes after its zlib/gzip stream")


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _npy_header(raw: bytes, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, bool]:
    """(offset of the data, Fortran order) of a .npy file whose header matches the box; checked
    before any data is read (numpy.load allocates whatever shape a header claims)."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        reader = _NPY_HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
        header_shape, fortran_order, header_dtype = reader(stream)
    except (ValueError, TypeError, SyntaxError, tokenize.TokenError, RecursionError) as exc:
        # numpy parses the header dict with ast.literal_eval (no code runs), and old headers
        # through tokenize: each refuses a hostile header with its own exception
        raise InvalidBody(f"npygz body is not a .npy array: {type(exc).__name__}: {exc}"[:500]) from None
    if header_dtype != dtype:
        raise InvalidBody(f"body has dtype {header_dtype}, the channel stores {dtype}")
    if tuple(header_shape) != shape:
        raise InvalidBody(f"body has shape {tuple(header_shape)}, the box needs {shape}")
    return stream.tell(), bool(fortran_order)


def _check_npy_data(held: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
    expected = _expected_nbytes(shape, dtype)
    if held != expected:
        raise InvalidBody(f"npygz body holds {held} bytes of array data, the box {shape} of {dtype} needs {expected}")


class OctetStreamFormat:
    """`application/octet-stream`: raw C-order bytes."""

    media_type: ClassVar[str] = "application/octet-stream"

    def encode(self, array: Array) -> bytes:
        return np.ascontiguousarray(array).tobytes()

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        return _raw_to_array(body, shape, dtype)

    def validate(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        _raw_to_array(body, shape, dtype)


FORMATS: dict[str, WireFormat] = {
    f.media_type: f for f in (BloscFormat(), BloscPythonFormat(), NpygzFormat(), OctetStreamFormat())
}


def format_for(media_type: str) -> WireFormat:
    try:
        return FORMATS[media_type]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise UnsupportedMediaType(f"media type {media_type!r} is not supported; use one of {known}") from None
