"""A numpy array read out of a pickle by walking its opcodes: no Unpickler, no import, no call.

python-blosc's ``pack_array`` (the `application/blosc-python` media type) compresses
``pickle.dumps(array)``. A pickle is a program: unpickling one from a client runs whatever it
names. This module never runs it. It reads the opcodes one by one and accepts only the shapes
that numpy itself writes for a plain ndarray, for pickle protocols 2 to 5 (Python 2 and 3,
numpy 1.x ``numpy.core`` and 2.x ``numpy._core`` names):

    _reconstruct(ndarray, (0,), b'b') + BUILD (1, shape, dtype, is_fortran, raw)   protocols 2-4
    _frombuffer(raw, dtype, shape, order)                                         protocol 5
    dtype(kind, align, copy) + BUILD (3, byteorder, None, None, None, ...)        the dtype

The names a pickle gives (GLOBAL, STACK_GLOBAL) are compared as strings with that short list and
become inert tokens; REDUCE and BUILD are interpreted only for those tokens with exactly those
arguments. The array is then made here, from the bytes the pickle holds (a view of them, never
an allocation of a shape the pickle claims), in one of the datatypes a channel stores.
Anything else is refused with InvalidBody naming what was found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ndstore.core.errors import InvalidBody

Array = npt.NDArray[Any]

MAX_STACK = 64
MAX_MEMO = 256
MAX_NAME = 64  # module and attribute names, dtype strings
DTYPE_KINDS = {"u1", "u2", "u4", "u8", "f4"}  # what a channel stores (ndstore.api.models)
LITTLE_OR_NONE = {"<", "|", "="}


@dataclass(frozen=True)
class _Global:
    """An allowed name, never resolved to the object it names."""

    name: str


RECONSTRUCT, FROMBUFFER, NDARRAY, DTYPE, ENCODE = (
    _Global(n) for n in ("_reconstruct", "_frombuffer", "ndarray", "dtype", "_codecs.encode"))
GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): RECONSTRUCT, ("numpy._core.multiarray", "_reconstruct"): RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): FROMBUFFER, ("numpy._core.numeric", "_frombuffer"): FROMBUFFER,
    ("numpy", "ndarray"): NDARRAY, ("numpy", "dtype"): DTYPE,
    ("_codecs", "encode"): ENCODE,  # bytes in a protocol 2 pickle written by Python 3
}


class _Dtype:
    """`numpy.dtype(kind, ...)` awaiting its BUILD state (byte order)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.dtype: np.dtype | None = None

    def build(self, state: Any) -> None:
        if self.dtype is not None:
            raise InvalidBody("blosc-python body builds a dtype twice")
        if not (isinstance(state, tuple) and len(state) >= 5 and state[0] in (3, 4)):
            raise InvalidBody("blosc-python body has a dtype state numpy does not write")
        byteorder, subarray, names, fields = _text(state[1]), *state[2:5]
        if (subarray, names, fields) != (None, None, None):
            raise InvalidBody("blosc-python body's dtype is structured or a sub-array; channels store plain numbers")
        if byteorder not in LITTLE_OR_NONE:
            raise InvalidBody(f"blosc-python body's dtype has byte order {byteorder!r}; send little-endian data")
        self.dtype = np.dtype("<" + self.kind)

    def value(self) -> np.dtype:
        if self.dtype is None:
            raise InvalidBody("blosc-python body uses a dtype before building it")
        return self.dtype


@dataclass
class _Array:
    """An ndarray described by the pickle: its bytes, dtype, shape and memory order."""

    raw: Any = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    order: str = "C"
    axes: tuple[int, ...] | None = None  # protocol 5, order "K": the axis permutation

    def build(self, state: Any) -> None:
        if self.raw is not None:
            raise InvalidBody("blosc-python body builds an array twice")
        if not isinstance(state, tuple) or len(state) not in (4, 5) or (len(state) == 5 and state[0] != 1):
            raise InvalidBody("blosc-python body has an ndarray state numpy does not write")
        shape, dtype, fortran, raw = state[-4:]
        if not isinstance(fortran, (bool, int)):
            raise InvalidBody("blosc-python body has an ndarray state numpy does not write")
        self.set(_bytes(raw), dtype, shape, "F" if fortran else "C")

    def set(self, raw: Any, dtype: Any, shape: Any, order: Any, axes: Any = None) -> None:
        if not isinstance(raw, (bytes, memoryview)):
            raise InvalidBody("blosc-python body's array data is not a byte string")
        if not isinstance(dtype, _Dtype):
            raise InvalidBody("blosc-python body's array has no numpy dtype")
        if not (isinstance(shape, tuple) and len(shape) <= 8 and all(_is_int(n) and n >= 0 for n in shape)):
            raise InvalidBody("blosc-python body's array shape is not a tuple of sizes")
        if order not in ("C", "F", "K") or (order == "K") != (axes is not None):
            raise InvalidBody(f"blosc-python body's array order {order!r} is not C, F or K")
        if axes is not None and not (isinstance(axes, tuple) and sorted(axes) == list(range(len(shape)))):
            raise InvalidBody("blosc-python body's axis order is not a permutation of its axes")
        self.raw, self.dtype, self.shape, self.order, self.axes = raw, dtype.value(), shape, order, axes

    def array(self) -> Array:
        if self.raw is None or self.dtype is None or self.shape is None:
            raise InvalidBody("blosc-python body's array is never given its data")
        count = 1
        for n in self.shape:
            count *= n
        if count * self.dtype.itemsize != len(self.raw):
            raise InvalidBody(f"blosc-python body's array of shape {self.shape} {self.dtype} holds "
                              f"{len(self.raw)} bytes, not {count * self.dtype.itemsize}")
        flat = np.frombuffer(self.raw, dtype=self.dtype)
        if self.order == "K" and self.axes is not None:
            return flat.reshape(self.shape, order="C").transpose(self.axes)
        return flat.reshape(self.shape, order="F" if self.order == "F" else "C")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class _Py2Str:
    """A Python 2 `str` (SHORT_BINSTRING, BINSTRING): a name, a dtype string or array data."""

    data: memoryview


def _text(v: Any) -> Any:
    """A str for text or a short Python 2 str; other values as they are."""
    if isinstance(v, _Py2Str) and len(v.data) <= MAX_NAME:
        return bytes(v.data).decode("latin-1")
    return v


def _bytes(v: Any) -> Any:
    return v.data if isinstance(v, _Py2Str) else v


_MARK = object()


class _Walk:
    """The opcode walk: a stack machine over inert values, bounded in stack, memo and names."""

    def __init__(self, raw: memoryview):
        self.raw = raw
        self.pos = 0
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    # -- reading arguments -----------------------------------------------------------------
    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.raw):
            raise InvalidBody(f"blosc-python body's pickle claims {n} bytes at {self.pos}, past its end")
        out = self.raw[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little")

    def long1(self) -> int:
        n = self.uint(1)
        if n > 8:
            raise InvalidBody("blosc-python body's pickle holds an integer wider than 64 bits")
        return int.from_bytes(self.take(n), "little", signed=True)

    def line(self) -> str:
        end = bytes(self.raw[self.pos:self.pos + MAX_NAME + 1]).find(b"\n")
        if end < 0:
            raise InvalidBody("blosc-python body's pickle has a GLOBAL name that is too long or does not end")
        return bytes(self.take(end + 1)[:-1]).decode("latin-1")

    def text(self, size: int) -> None:
        try:
            self.push(bytes(self.take(self.uint(size))).decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidBody("blosc-python body's pickle holds a string that is not UTF-8") from None

    def data(self, size: int) -> None:
        self.push(self.take(self.uint(size)))  # array data: a view of the body, never copied

    # -- the stack ---------------------------------------------------------------------------
    def proto(self, version: int) -> None:
        if self.pos != 2 or not 2 <= version <= 5:
            raise InvalidBody(f"blosc-python body is not a pickle of protocol 2 to 5 (PROTO {version})")

    def push(self, value: Any) -> None:
        if len(self.stack) >= MAX_STACK:
            raise InvalidBody("blosc-python body's pickle is deeper than any numpy array pickle")
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise InvalidBody("blosc-python body's pickle pops an empty stack")
        return self.stack.pop()

    def tuple(self, n: int) -> None:
        items = [self.pop() for _ in range(n)]
        self.push(tuple(reversed(items)))

    def pop_mark(self) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                items = tuple(self.stack[i + 1:])
                del self.stack[i:]
                self.push(items)
                return
        raise InvalidBody("blosc-python body's pickle closes a tuple it never opened")

    def put(self, index: int) -> None:
        if not self.stack or self.stack[-1] is _MARK:
            raise InvalidBody("blosc-python body's pickle memoizes nothing")
        if len(self.memo) >= MAX_MEMO and index not in self.memo:
            raise InvalidBody("blosc-python body's pickle memoizes more than any numpy array pickle")
        self.memo[index] = self.stack[-1]

    def get(self, index: int) -> None:
        if index not in self.memo:
            raise InvalidBody(f"blosc-python body's pickle reads memo entry {index}, which it never wrote")
        self.push(self.memo[index])

    def global_(self, module: Any, name: Any) -> None:
        module, name = _text(module), _text(name)
        token = GLOBALS.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
        if token is None:
            shown = f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else "a non-name"
            raise InvalidBody(f"blosc-python body pickles {shown[:2 * MAX_NAME]!r}, which is not a part of a "
                              "numpy array")
        self.push(token)

    def stack_global(self) -> None:
        name, module = self.pop(), self.pop()
        self.global_(module, name)

    def reduce(self) -> None:
        args, fn = self.pop(), self.pop()
        if not isinstance(args, tuple):
            raise InvalidBody("blosc-python body's pickle calls with arguments that are not a tuple")
        args = tuple(_text(a) for a in args)
        if fn is DTYPE and len(args) == 3 and args[0] in DTYPE_KINDS:
            self.push(_Dtype(args[0]))
        elif fn is DTYPE:
            kind = args[0] if args and isinstance(args[0], str) else "?"
            raise InvalidBody(f"blosc-python body's dtype {kind[:MAX_NAME]!r} is not one a channel stores "
                              f"({', '.join(sorted(DTYPE_KINDS))})")
        elif fn is RECONSTRUCT and len(args) == 3 and args[0] is NDARRAY:
            self.push(_Array())
        elif fn is FROMBUFFER and len(args) in (4, 5):
            array = _Array()
            array.set(_bytes(args[0]), *args[1:])
            self.push(array)
        elif fn is ENCODE and len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
            try:
                self.push(args[0].encode("latin-1"))
            except UnicodeEncodeError:
                raise InvalidBody("blosc-python body's pickle holds bytes that are not latin-1") from None
        else:
            raise InvalidBody("blosc-python body's pickle makes a call that numpy's array pickle does not make")

    def build(self) -> None:
        state, target = self.pop(), self.pop()
        if not isinstance(target, (_Dtype, _Array)):
            raise InvalidBody("blosc-python body's pickle sets the state of something other than an array or dtype")
        target.build(state)
        self.push(target)


def _py2(walk: _Walk, size: int) -> None:
    walk.push(_Py2Str(walk.take(walk.uint(size))))


# Each allowed opcode and what it does; any other opcode (lists, dicts, sets, object builders,
# persistent ids, out-of-band buffers, the text protocols 0 and 1) refuses the body.
OPS: dict[int, Callable[[_Walk], object]] = {
    0x95: lambda w: w.uint(8),  # FRAME: a hint of the next frame's length
    ord("("): lambda w: w.push(_MARK),  # MARK
    ord("t"): lambda w: w.pop_mark(),  # TUPLE
    ord(")"): lambda w: w.push(()),  # EMPTY_TUPLE
    0x85: lambda w: w.tuple(1), 0x86: lambda w: w.tuple(2), 0x87: lambda w: w.tuple(3),  # TUPLE1..3
    ord("N"): lambda w: w.push(None), 0x88: lambda w: w.push(True), 0x89: lambda w: w.push(False),
    ord("J"): lambda w: w.push(int.from_bytes(w.take(4), "little", signed=True)),  # BININT
    ord("K"): lambda w: w.push(w.uint(1)), ord("M"): lambda w: w.push(w.uint(2)),  # BININT1, BININT2
    0x8a: lambda w: w.push(w.long1()),  # LONG1
    0x8c: lambda w: w.text(1), ord("X"): lambda w: w.text(4), 0x8d: lambda w: w.text(8),  # (SHORT_)BINUNICODE(8)
    ord("U"): lambda w: _py2(w, 1), ord("T"): lambda w: _py2(w, 4),  # SHORT_BINSTRING, BINSTRING
    ord("C"): lambda w: w.data(1), ord("B"): lambda w: w.data(4), 0x8e: lambda w: w.data(8),  # (SHORT_)BINBYTES(8)
    0x96: lambda w: w.data(8),  # BYTEARRAY8
    ord("c"): lambda w: w.global_(w.line(), w.line()),  # GLOBAL
    0x93: lambda w: w.stack_global(),  # STACK_GLOBAL
    ord("q"): lambda w: w.put(w.uint(1)), ord("r"): lambda w: w.put(w.uint(4)),  # BINPUT, LONG_BINPUT
    0x94: lambda w: w.put(len(w.memo)),  # MEMOIZE
    ord("h"): lambda w: w.get(w.uint(1)), ord("j"): lambda w: w.get(w.uint(4)),  # BINGET, LONG_BINGET
    ord("R"): lambda w: w.reduce(), ord("b"): lambda w: w.build(),  # REDUCE, BUILD
}
PROTO, STOP = 0x80, ord(".")


def array_from_pickle(raw: bytes | memoryview | Array) -> Array:
    """The ndarray a numpy pickle describes, as a view of ``raw``; InvalidBody for anything else."""
    walk = _Walk(memoryview(raw).cast("B"))  # type: ignore[arg-type]  # an ndarray is a buffer
    if len(walk.raw) < 2 or walk.raw[0] != PROTO:
        raise InvalidBody("blosc-python body is not a binary pickle (protocol 2 to 5)")
    walk.pos = 2
    walk.proto(walk.raw[1])
    while True:
        if walk.pos >= len(walk.raw):
            raise InvalidBody("blosc-python body's pickle ends without STOP")
        code = walk.raw[walk.pos]
        walk.pos += 1
        if code == STOP:
            break
        op = OPS.get(code)
        if op is None:
            raise InvalidBody(f"blosc-python body's pickle uses opcode {bytes([code])!r} at {walk.pos - 1}, "
                              "which a numpy array pickle does not use")
        op(walk)
    if walk.pos != len(walk.raw):
        raise InvalidBody(f"blosc-python body has {len(walk.raw) - walk.pos} bytes after its pickle")
    if len(walk.stack) != 1 or not isinstance(walk.stack[0], _Array):
        raise InvalidBody("blosc-python body's pickle does not describe one numpy array")
    return walk.stack[0].array()
