"""Wire formats of cutout bodies, one class per media type, each a pure encode/decode pair.

Every decoder checks the size a body claims before it inflates it (no decompression bombs),
then checks the decoded array's shape and dtype against the box it is written to.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import zlib
from typing import Any, ClassVar, Protocol

import blosc
import blosc2
import numpy as np
import numpy.typing as npt

from ndstore.core.errors import InvalidBody, UnsupportedMediaType

Array = npt.NDArray[Any]


class WireFormat(Protocol):
    media_type: ClassVar[str]

    def encode(self, array: Array) -> bytes: ...

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array: ...

    def check_framing(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Cheap checks of a body's framing against the box, without inflating it (the NDBlaze
        write path stores bodies as they arrive); `decode` still does the full check later."""


def _expected_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _blosc_nbytes(body: bytes) -> int:
    return _blosc_sizes(body)[0]


def _blosc_sizes(body: bytes) -> tuple[int, int]:
    """(nbytes, cbytes) that a blosc header claims; cbytes must be the body's length."""
    try:
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(body)
    except Exception as exc:  # blosc raises bare RuntimeError/ValueError on a bad header
        raise InvalidBody(f"body is not a blosc buffer: {exc}") from None
    if cbytes != len(body):
        raise InvalidBody(f"blosc header claims {cbytes} compressed bytes, the body holds {len(body)}")
    return int(nbytes), int(cbytes)


# python-blosc (c-blosc 1.x) decodes 16 MiB bodies about 10x faster here than blosc2 with its
# default threads; blosc2 is kept for chunks that only it can read (format version 3 and up).
_BLOSC1_MAX_VERSION = 2
# Concurrent requests of one web process (gthread) must not queue behind one body's
# (de)compression: python-blosc holds the GIL by default.
blosc.set_releasegil(True)


def _blosc_decompress_into(body: bytes, out: Array) -> None:
    try:
        if body[0] <= _BLOSC1_MAX_VERSION:
            blosc.decompress_ptr(body, out.ctypes.data)
        else:
            blosc2.decompress2(body, dst=out)
    except Exception as exc:
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
        return blosc.compress(data, typesize=data.dtype.itemsize, cname="lz4", clevel=5)  # type: ignore[no-any-return]

    def check_framing(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        expected = _expected_nbytes(shape, dtype)
        claimed = _blosc_nbytes(body)
        if claimed != expected:
            raise InvalidBody(
                f"blosc body holds {claimed} bytes, the box {shape} of {dtype} needs {expected}"
            )

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        self.check_framing(body, shape, dtype)
        out = np.empty(shape, dtype)
        _blosc_decompress_into(body, out)
        return out


_FROMBUFFER = {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}
_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}


class _NdarrayToken:
    """Stands for numpy.ndarray in a pickle: the subtype `_reconstruct` names (never called)."""


class _PickledArray:
    """`_reconstruct(ndarray, shape, typecode)`, what pickle protocols 2 to 4 call, allocates the
    shape it is given; this makes the array only in __setstate__, as a view of the pickled bytes."""

    def __init__(self, subtype: Any, shape: Any, typecode: Any):
        if subtype is not _NdarrayToken:
            raise InvalidBody("blosc-python body reconstructs something other than a numpy.ndarray")
        self.array: Array | None = None

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        *_, shape, dtype, fortran_order, raw = state  # (version,) shape, dtype, is_fortran, rawdata
        self.array = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


def _array_from_buffer(buf: Any, dtype: Any, shape: Any, order: Any, axis_order: Any = None) -> Array:
    """numpy's own `_frombuffer` (pickle protocol 5): a view of the pickled bytes, nothing allocated."""
    array = np.frombuffer(buf, dtype=dtype)
    if order == "K" and axis_order is not None:
        return array.reshape(shape, order="C").transpose(axis_order)
    return array.reshape(shape, order=order)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles one numpy array and nothing else: a pickle from a client is never trusted. The
    array is always a view of bytes the pickle holds, never allocated from a shape it claims, and
    no numpy callable runs but the dtype constructor."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FROMBUFFER:
            return _array_from_buffer
        if (module, name) in _RECONSTRUCT:
            return _PickledArray
        if (module, name) == ("numpy", "ndarray"):
            return _NdarrayToken
        if (module, name) == ("numpy", "dtype") or module == "numpy.dtypes":
            return super().find_class(module, name)
        raise InvalidBody(f"blosc-python body pickles {module}.{name}, which is not allowed")


_MEMO_OPCODES = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def _unpickle_array(raw: bytes) -> Any:
    # The unpickler allocates what an opcode claims before it reads or uses it: the length of a
    # counted one (BYTEARRAY8, BINBYTES8, ...), and a memo table as long as the largest index
    # put. Walk the opcodes first: pickletools reads only what is there and refuses a count past
    # the end, and an honest pickle's memo holds fewer entries than it has bytes.
    for opcode, arg, _ in pickletools.genops(io.BytesIO(raw)):
        if opcode.name in _MEMO_OPCODES and isinstance(arg, int) and arg >= len(raw):
            raise InvalidBody(f"blosc-python body's pickle uses memo index {arg}, past its {len(raw)} bytes")
    loaded = _NumpyOnlyUnpickler(io.BytesIO(raw)).load()
    return loaded.array if isinstance(loaded, _PickledArray) else loaded


class BloscPythonFormat:
    """`application/blosc-python`: python-blosc's ``pack_array`` (a pickled array, compressed)."""

    media_type: ClassVar[str] = "application/blosc-python"
    _PICKLE_OVERHEAD = 4096

    def encode(self, array: Array) -> bytes:
        return blosc.pack_array(np.ascontiguousarray(array), cname="lz4")  # type: ignore[no-any-return]

    def check_framing(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        claimed, expected = _blosc_nbytes(body), _expected_nbytes(shape, dtype)
        if not expected <= claimed <= expected + self._PICKLE_OVERHEAD:
            raise InvalidBody(f"blosc-python body holds {claimed} bytes, not a pickled {shape} {dtype} array")

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        self.check_framing(body, shape, dtype)
        raw = _blosc_decompress(body, _blosc_nbytes(body)).tobytes()
        try:
            array = _unpickle_array(raw)
        except InvalidBody:
            raise
        except Exception as exc:
            raise InvalidBody(f"blosc-python body does not hold a pickled array: {exc}") from None
        if not isinstance(array, np.ndarray):
            raise InvalidBody("blosc-python body does not hold an array")
        return _check_array(array, shape, dtype)


class NpygzFormat:
    """`application/npygz`: ``numpy.save`` output, zlib- (or gzip-) compressed."""

    media_type: ClassVar[str] = "application/npygz"
    _HEADER_ALLOWANCE = 4096

    def encode(self, array: Array) -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        return zlib.compress(buf.getbuffer(), 1)

    def check_framing(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and int.from_bytes(body[:2], "big") % 31 == 0
        if not (zlib_header or body[:2] == b"\x1f\x8b"):
            raise InvalidBody("npygz body starts with neither a zlib nor a gzip header")

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        limit = _expected_nbytes(shape, dtype) + self._HEADER_ALLOWANCE
        inflater = zlib.decompressobj(wbits=47)  # zlib or gzip header, detected
        try:
            raw = inflater.decompress(body, limit)
        except zlib.error as exc:
            raise InvalidBody(f"npygz body is not zlib/gzip data: {exc}") from None
        if inflater.unconsumed_tail:
            raise InvalidBody(f"npygz body inflates past the {shape} {dtype} box")
        if not inflater.eof:
            raise InvalidBody("npygz body is truncated: its zlib/gzip stream does not end")
        if inflater.unused_data:
            raise InvalidBody(f"npygz body has {len(inflater.unused_data)} bytes after its zlib/gzip stream")
        return _npy_to_array(raw, shape, dtype)


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _npy_to_array(raw: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
    """The array of a .npy file, its header checked against the box before any data is read
    (numpy.load allocates whatever shape a header claims)."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        reader = _NPY_HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
        header_shape, fortran_order, header_dtype = reader(stream)
    except ValueError as exc:
        raise InvalidBody(f"npygz body is not a .npy array: {exc}") from None
    if header_dtype != dtype:
        raise InvalidBody(f"body has dtype {header_dtype}, the channel stores {dtype}")
    if tuple(header_shape) != shape:
        raise InvalidBody(f"body has shape {tuple(header_shape)}, the box needs {shape}")
    expected, offset = _expected_nbytes(shape, dtype), stream.tell()
    if len(raw) - offset != expected:
        raise InvalidBody(f"npygz body holds {len(raw) - offset} bytes of array data, the box {shape} of "
                          f"{dtype} needs {expected}")
    array = np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)), offset=offset)
    return array.reshape(shape, order="F" if fortran_order else "C")


class OctetStreamFormat:
    """`application/octet-stream`: raw C-order bytes."""

    media_type: ClassVar[str] = "application/octet-stream"

    def encode(self, array: Array) -> bytes:
        return np.ascontiguousarray(array).tobytes()

    def check_framing(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> None:
        expected = _expected_nbytes(shape, dtype)
        if len(body) != expected:
            raise InvalidBody(f"body holds {len(body)} bytes, the box {shape} of {dtype} needs {expected}")

    def decode(self, body: bytes, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        return _raw_to_array(body, shape, dtype)


FORMATS: dict[str, WireFormat] = {
    f.media_type: f for f in (BloscFormat(), BloscPythonFormat(), NpygzFormat(), OctetStreamFormat())
}


def format_for(media_type: str) -> WireFormat:
    try:
        return FORMATS[media_type]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise UnsupportedMediaType(f"media type {media_type!r} is not supported; use one of {known}") from None
