"""The attacker who sends a pickle: no body makes any process run code (DESIGN §9).

`application/blosc-python` bodies are pickles. The report's exploit, a protocol 4 pickle that
follows the dotted name `numpy.dtypes.__builtins__.get` to eval, ran code in the web worker that
decoded it, and, stored by NDBlaze, again in every reader, the merger and the Spark workers.
Each test here plants that exploit (or a plain call of a canary function) where one of those
processes decodes it, and looks for the mark it would leave."""

from __future__ import annotations

import ast
import os
import pickle
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from blaze.blob import BlobHeader, supercuboid_names
from ndstore.core import wire
from ndstore.core.errors import DataCorrupt, InvalidBody
from ndstore.core.geometry import Box
from ndstore.core.pickled_array import array_from_pickle
from ndstore.engine.volume import Cutout
from tests.api.conftest import Dataset, make_dataset
from tests.blaze.conftest import Blaze, wired  # noqa: F401  (fixture)
from tests.engine.conftest import small_channel
from tests.security import canary
from tests.security.hostile_pickles import as_body, canary_call, canary_code, eval_through_numpy_dtypes, pickle_text

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (4, 16, 16)
CUTOUT = "ds/e1/img8/0/0:16/0:16/0:4/"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where code run by a hostile body leaves its mark, in this process or any other."""
    path = tmp_path / "code-ran"
    monkeypatch.setenv("NDSTORE_TEST_CANARY", str(path))  # NDSTORE_*: Spark workers receive it too
    canary.CALLS.clear()
    return path


def exploit(marker: Path) -> bytes:
    return as_body(eval_through_numpy_dtypes(canary_code(str(marker))), SHAPE, np.dtype(np.uint8))


@pytest.fixture
def public_ds(admin: APIClient) -> Dataset:
    from ndstore.api.models import Collection

    ds = make_dataset(admin, name="ds")
    Collection.objects.filter(name="ds").update(public=True)
    return ds


@pytest.mark.parametrize("tier", ["cutout", "direct/cutout", "blaze/cutout"])
def test_a_pickled_exploit_written_to_any_tier_is_a_400_and_runs_nothing(admin: APIClient, public_ds: Dataset,
                                                                          marker: Path, tier: str) -> None:
    r = admin.generic("POST", f"/v1/{tier}/{CUTOUT}", exploit(marker), content_type="application/blosc-python")
    assert r.status_code == 400 and "numpy.dtypes.__builtins__.get" in r.json()["message"]
    assert not marker.exists()
    from ndstore.wiring import services

    assert services().blaze_buffer.stats().blobs == 0  # refused, not stored for later decoders


def _plant(buffer: Any, cutout: Cutout, body: bytes) -> int:
    """Store a body in the NDBlaze buffer as an earlier version acknowledged it (framing only)."""
    header = BlobHeader.for_cutout(cutout, "application/blosc-python", has_time=False)
    return int(buffer.append(header.to_json(), body, supercuboid_names(header)))


def test_a_stored_exploit_runs_nothing_in_an_anonymous_reader(public_ds: Dataset, marker: Path) -> None:
    from ndstore.api import lookups
    from ndstore.wiring import services

    _, _, chan = lookups.channel_path("ds", "e1", "img8")
    cutout = Cutout(lookups.channel_volume(chan), 0, Box((0, 0, 0), (16, 16, 4)), range(1))
    services().blaze_ledger.verify()  # as the service's start does: the buffer takes writes after its check
    _plant(services().blaze_buffer, cutout, exploit(marker))
    r = APIClient().get(f"/v1/blaze/cutout/{CUTOUT}", HTTP_ACCEPT="application/octet-stream")
    assert r.status_code == 500 and "no longer decodes" in r.json()["message"]
    assert not marker.exists()


def test_a_stored_exploit_runs_nothing_in_the_merger_or_spark_workers(wired: Blaze, spark: Any,  # noqa: F811
                                                                       marker: Path) -> None:
    from blaze.spark_job import merge_round
    from ndstore import wiring

    channel = small_channel("uint8")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (16, 16, 4)), range(1))
    _plant(wired.buffer, cutout, exploit(marker))
    with pytest.raises(DataCorrupt):
        wired.tier.read(cutout)
    assert wired.merger.merge(wired.buffer.pending_names()).supercuboids_failed == 1
    assert merge_round(spark, wired.buffer, partial(wiring.merger_for, wired.config)).supercuboids_failed == 1
    assert not marker.exists()
    assert wired.buffer.stats().blobs == 1  # not dropped either: an operator decides


def test_no_module_unpickles_evaluates_or_imports_by_a_name_it_was_given() -> None:
    """No code that serves requests, merges or handles events can turn bytes into a call: no
    pickle/marshal/shelve loads, no eval/exec/compile, no import of a computed name. (The
    upload client's --plugin imports a module its own user names on its own machine.)"""
    banned_modules = {"pickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "pickletools"}
    allowed = {("ndstore/client/ingest.py", "import_module")}
    found = []
    for path in sorted([*ROOT.glob("ndstore/**/*.py"), *ROOT.glob("blaze/*.py"), *ROOT.glob("lambdas/*.py")]):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            found += [(rel, n) for n in names if n in banned_modules]
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                builtin = isinstance(fn, ast.Name) and called in ("eval", "exec", "compile", "__import__")
                numpy_load = called == "load" and isinstance(fn, ast.Attribute) and getattr(fn.value, "id", "") == "np"
                by_name = called in ("import_module", "unpack_array")
                if (builtin or numpy_load or by_name) and (rel, called) not in allowed:
                    found.append((rel, called))
    assert found == []


# -- the decoder itself, fuzzed -------------------------------------------------------------

DANGEROUS = [("os", "system"), ("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"),
             ("subprocess", "Popen"), ("numpy", "load"), ("numpy.core.multiarray", "scalar"),
             ("numpy._core.multiarray", "_reconstruct.__globals__"), ("numpy", "dtype.__init__.__globals__"),
             ("numpy.dtypes", "__builtins__.get"), ("numpy.dtypes", "_add_dtype_helper"),
             ("numpy", "testing.os.system"), ("numpy", "ndarray.__reduce__"), ("tests.security.canary", "touch"),
             ("__main__", "touch"), ("copyreg", "_reconstructor"), ("functools", "partial"), ("_codecs", "decode")]
SAFE_PARTS = [  # pieces of real array pickles, memo and stack tricks, huge counts, opcodes numpy never writes
    b"\x8c\x05numpy\x8c\x05dtype\x93", b"\x8c\x02u1\x89\x88\x87R",
    b"(K\x03\x8c\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb",
    b"\x8c\x15numpy._core.multiarray\x8c\x0c_reconstruct\x93", b"\x8c\x05numpy\x8c\x07ndarray\x93K\x00\x85C\x01b\x87R",
    b"\x94", b"h\x00", b"q\x05", b"j\xff\xff\xff\x7f", b"r\xff\xff\xff\xff", b"(", b"t", b")", b"\x85", b"\x86",
    b"\x87", b"R", b"b", b"N", b"K\x07", b"\x8e\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x96\x00\x00\x00\x00\x01\x00\x00\x00", b"B\xff\xff\xff\x7f", b"C\x04abcd", b"\x8a\x09" + b"\x01" * 9,
    b"0", b"1", b"2", b"]", b"}", b"e", b"s", b"u", b"a",
    b"P", b"\x8f", b"\x90", b"\x91", b"\x92", b"\x97", b"\x98", b"i", b"o", b"\x81", b"\x82", b"c", b"\x95" + b"\0" * 8,
]


@st.composite
def hostile_pickles(draw: Any) -> bytes:
    """Pickles built from opcodes: dangerous globals (plain, dotted, by GLOBAL or STACK_GLOBAL),
    memo tricks, nested reduces and builds, huge counted lengths, opcodes numpy never writes,
    mixed with the parts of a real array pickle."""
    parts = [b"\x80" + bytes([draw(st.sampled_from([2, 3, 4, 5, 0, 6]))])]
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["global", "stack_global", "safe", "bytes"]))
        if kind in ("global", "stack_global"):
            module, name = draw(st.sampled_from(DANGEROUS))
            parts.append(b"c" + f"{module}\n{name}\n".encode() if kind == "global"
                         else pickle_text(module) + pickle_text(name) + b"\x93")
            parts.append(draw(st.sampled_from([b"", pickle_text("x") + b"\x85R", b")R", b"N\x85R", b"(tR"])))
        elif kind == "safe":
            parts.append(draw(st.sampled_from(SAFE_PARTS)))
        else:
            parts.append(draw(st.binary(max_size=12)))
    if draw(st.booleans()):
        parts.append(b".")
    return b"".join(parts)


@settings(max_examples=int(600 * float(os.environ.get("NDSTORE_FUZZ_SCALE", "1"))), deadline=None)
@given(hostile_pickles())
def test_hostile_pickles_call_nothing_and_are_refused(monkeypatch: pytest.MonkeyPatch, pickled: bytes) -> None:
    canary.CALLS.clear()
    sys.modules.pop("tests.security.canary_never", None)

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("the decoder unpickled")

    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    try:
        array = array_from_pickle(pickled)
        assert isinstance(array, np.ndarray) and array.dtype.kind in "uf"
    except InvalidBody:
        pass
    assert canary.CALLS == []
    shape = (2, 3, 4)
    try:
        wire.FORMATS["application/blosc-python"].decode(as_body(pickled, shape, np.dtype(np.uint8)), shape,
                                                        np.dtype(np.uint8))
    except InvalidBody:
        pass
    assert canary.CALLS == []


@pytest.mark.parametrize(("module", "name"), DANGEROUS)
def test_each_dangerous_name_is_refused_by_name_never_imported(module: str, name: str) -> None:
    never = "tests.security.never_imported"
    with pytest.raises(InvalidBody, match="not a part of a numpy array"):
        array_from_pickle(canary_call(module, name))
    with pytest.raises(InvalidBody):
        array_from_pickle(canary_call(never, "touch"))
    assert never not in sys.modules and canary.CALLS == []


def test_pickles_of_numpy_1_python_2_and_every_protocol_decode() -> None:
    """What real clients send still decodes: numpy 1.x names, protocols 2 to 5, C and Fortran
    order, a Python 2 pickle (SHORT_BINSTRING/BINSTRING strings)."""
    import base64

    import blosc

    numpy1 = base64.b64decode(  # blosc.pack_array(np.arange(24, dtype='u2').reshape(2, 3, 4)) on numpy 1.26.4
        "AgETArIAAACyAAAAwgAAAIAFlacAAAAAAAAAjBJudW1weS5jb3JlLm51bWVyaWOUjAtfZnJvbWJ1ZmZlcpSTlCiWMAAAAAAAAAAAAAEAAgAD"
        "AAQABQAGAAcACAAJAAoACwAMAA0ADgAPABAAEQASABMAFAAVABYAFwCUjAVudW1weZSMBWR0eXBllJOUjAJ1MpSJiIeUUpQoSwOMATyUTk5O"
        "Sv////9K/////0sAdJRiSwJLA0sEh5SMAUOUdJRSlC4=")
    expected = np.arange(24, dtype="u2").reshape(2, 3, 4)
    assert np.array_equal(wire.FORMATS["application/blosc-python"].decode(numpy1, (2, 3, 4), np.dtype("u2")),
                          expected)
    raw = expected.tobytes()

    def py2(s: bytes) -> bytes:
        return b"U" + bytes([len(s)]) + s

    python2 = (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85" + py2(b"b")
               + b"\x87R(K\x01K\x02K\x03K\x04\x87cnumpy\ndtype\n" + py2(b"u2") + b"K\x00K\x01\x87R(K\x03" + py2(b"<")
               + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89T" + len(raw).to_bytes(4, "little") + raw + b"tb.")
    assert np.array_equal(array_from_pickle(python2), expected)
    for protocol in (2, 3, 4, 5):
        for array in (expected, np.asfortranarray(expected), expected.transpose(2, 0, 1)):
            body = blosc.compress(pickle.dumps(array, protocol), typesize=1)
            out = wire.FORMATS["application/blosc-python"].decode(body, array.shape, array.dtype)
            assert np.array_equal(out, array)
