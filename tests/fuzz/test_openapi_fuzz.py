"""Fuzz every operation of the OpenAPI schema (/api/schema/, loaded from the app in-process over
WSGI) with schemathesis: as the admin, so requests reach the handlers, and anonymously (the
dataset's collection is public, so anonymous reads reach them too).

Checks on every response: no 5xx but 503 (not_a_server_error), and the body and its media type
match the schema wherever it describes them (response_schema_conformance,
content_type_conformance). Three cases in four are aimed at a real dataset (see `aim`), so the
fuzzer reaches the decoders and the tiers instead of stopping at 404.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from ndstore.api.models import ApiToken, Channel, Collection, CoordinateFrame, Experiment
from ndstore.core import wire

if os.environ.get("PYTEST_XDIST_WORKER"):
    # under pytest-xdist schemathesis collects one test per function that runs no case: a green
    # that fuzzed nothing. `make test` runs this file apart, in one process.
    raise RuntimeError("the schema fuzzer does not run under pytest-xdist (-n): run this file in one process, "
                       "e.g. `pytest tests/fuzz/test_openapi_fuzz.py`")

# Binary cutout bodies go on the wire as they were generated.
schemathesis.serializer.alias([m for m in wire.FORMATS if m != "application/octet-stream"],
                              "application/octet-stream")

# Per operation and identity: about 2,600 requests, under a minute on 2 cores. NDSTORE_FUZZ_SCALE
# multiplies it for a longer hunt.
MAX_EXAMPLES = int(10 * float(os.environ.get("NDSTORE_FUZZ_SCALE", "1")))
CONFIG = schemathesis.Config.from_dict({
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "database": "none"},
})
schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application(), config=CONFIG)
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]

FRAME = (1100, 700, 100)  # x, y, z
LEVELS, TIMES = 3, 2
CHANNELS = {"img8": "uint8", "img16": "uint16", "f32": "float32", "ann64": "uint64"}


@pytest.fixture
def fuzz_dataset(wired: None) -> User:
    """c1/e1/{img8,img16,f32,ann64} in a public collection (made with the ORM: quicker than the
    seven requests of tests.api.conftest.make_dataset, 260 times over); returns its creator."""
    user = User.objects.create(username="root", is_staff=True, is_superuser=True)
    frame = CoordinateFrame.objects.create(name="c1_frame", x_stop=FRAME[0], y_stop=FRAME[1], z_stop=FRAME[2],
                                           creator=user)
    coll = Collection.objects.create(name="c1", description="fuzz", public=True, creator=user)
    exp = Experiment.objects.create(collection=coll, name="e1", coord_frame=frame, num_hierarchy_levels=LEVELS,
                                    num_time_samples=TIMES, creator=user)
    for name, dtype in CHANNELS.items():
        Channel.objects.create(experiment=exp, name=name, datatype=dtype, creator=user,
                               type="annotation" if name.startswith("ann") else "image")
    return user


@pytest.fixture
def admin_headers(fuzz_dataset: User) -> dict[str, str]:
    _, key = ApiToken.mint(fuzz_dataset)
    return {"Authorization": f"Token {key}"}


@pytest.fixture
def wsgi_in_test_transaction() -> Iterator[None]:
    """What Django's test client does: requests must not close the test's database connection
    (the test runs inside a transaction that is rolled back afterwards)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _range(draw: Any, extent: int, hostile: bool) -> str:
    """A range inside the frame, or (hostile) one at or past its edges, inverted, or giant."""
    kind = draw(st.sampled_from(["edge", "outside", "inverted", "giant"])) if hostile else "inside"
    if kind == "inside":
        a = draw(st.integers(0, extent - 1))
        return f"{a}:{draw(st.integers(a + 1, min(extent, a + 24)))}"
    if kind == "edge":
        return str(draw(st.sampled_from([f"{extent - 1}:{extent}", f"0:{extent}", f"{extent}:{extent + 1}", "0:0"])))
    if kind == "outside":
        return f"{-draw(st.integers(1, 10**6))}:{draw(st.integers(0, 10**12 - 1))}"
    if kind == "inverted":
        return f"{extent}:{draw(st.integers(0, extent - 1))}"
    return f"0:{draw(st.integers(10**9, 10**12 - 1))}"


def _shape(case: Any) -> tuple[int, ...] | None:
    """The box a cutout case names, (t,) z, y, x, when its ranges are well formed and positive."""
    try:
        spans = [tuple(int(v) for v in case.path_parameters[a].split(":")) for a in ("t", "z", "y", "x")
                 if a in case.path_parameters]
    except (KeyError, ValueError, AttributeError):
        return None
    shape = tuple(b - a for a, b in spans)
    return shape if len(shape) >= 3 and all(0 < s <= 64 for s in shape) else None


def _body(draw: Any, case: Any, hostile: bool) -> bytes | None:
    """The box's array encoded in the case's media type; hostile: then flipped, cut or padded."""
    shape, dtype = _shape(case), CHANNELS.get(case.path_parameters.get("channel", ""))
    if shape is None or dtype is None or case.media_type not in wire.FORMATS:
        return None
    array = draw(st.sampled_from([np.zeros, np.ones]))(shape, dtype)
    body = bytearray(wire.format_for(case.media_type).encode(array))
    mutation = draw(st.sampled_from(["flip", "truncate", "extend"])) if hostile else "none"
    if mutation == "flip":
        i = draw(st.integers(0, len(body) - 1))
        body[i] ^= draw(st.integers(1, 255))
    elif mutation == "truncate":
        del body[draw(st.integers(0, len(body) - 1)):]
    elif mutation == "extend":
        body += draw(st.binary(min_size=1, max_size=64))
    return bytes(body)


def _resource_name(path: str) -> str:
    """The dataset's own name for a route's `{name}`."""
    for marker, name in (("channel/{name}", "img8"), ("experiment/{name}", "e1"), ("coord/{name}", "c1_frame")):
        if marker in path:
            return name
    return "c1"


CLEAN_QUERIES = [{}, {"access-mode": "no_cache"}, {"access-mode": "raw"}, {"format": "npygz"},
                 {"format": "octet-stream"}, {"filter": "1,2"}]


def aim(case: Any, draw: Any) -> None:
    """A quarter of the cases go as generated from the schema. The rest name the dataset: clean
    ones (half) a box inside its frame at a level it has, a valid query and a body that encodes
    the box; hostile ones an unknown channel or level, ranges at or past the frame's edges,
    inverted or giant, any query, and a flipped, cut or padded body."""
    mode = draw(st.sampled_from(["schema", "clean", "clean", "hostile"]))
    if mode == "schema":
        return
    hostile, params = mode == "hostile", case.path_parameters
    names = {"collection": "c1", "experiment": "e1", "name": _resource_name(case.path),
             "channel": draw(st.sampled_from([*CHANNELS, *(["nope"] if hostile else [])]))}
    params.update({k: v for k, v in names.items() if k in params})
    level = draw(st.sampled_from([0, 1, 2, *([3, 10**12] if hostile else [])]))
    if "resolution" in params:
        params["resolution"] = level
    shrink = level if level < LEVELS else 0  # anisotropic levels halve x and y
    for axis, extent in zip("xyzt", (FRAME[0] >> shrink, FRAME[1] >> shrink, FRAME[2], TIMES)):
        if axis not in params:
            continue
        bad = hostile and draw(st.booleans())
        if isinstance(params[axis], str) or "{" + axis + "}/" not in case.path:
            params[axis] = _range(draw, extent, bad)
        else:  # a plane of a slice image
            params[axis] = draw(st.integers(extent, 10**12) if bad else st.integers(0, extent - 1))
    if not hostile and any(p in case.path for p in ("/cutout/", "/image/")):
        case.query = dict(draw(st.sampled_from(CLEAN_QUERIES)))
        if "/image/" in case.path:
            case.query.pop("format", None)
    if case.method.upper() == "POST" and "/cutout/" in case.path:
        body = _body(draw, case, hostile)
        if body is not None:
            case.body = body


def _run(case: Any, data: Any, headers: dict[str, str]) -> None:
    aim(case, data.draw)
    case.call_and_validate(headers=headers, checks=CHECKS)


@schema.parametrize()
@schema.given(data=st.data())
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_as_admin(case: Any, data: Any, admin_headers: dict[str, str], wsgi_in_test_transaction: None) -> None:
    _run(case, data, admin_headers)


@schema.parametrize()
@schema.given(data=st.data())
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_anonymous(case: Any, data: Any, fuzz_dataset: User, wsgi_in_test_transaction: None) -> None:
    _run(case, data, {})
