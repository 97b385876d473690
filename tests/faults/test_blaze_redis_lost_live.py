"""NDBlaze writes acknowledged while no merger runs (this stack runs none, as a stack whose merger
has not started yet or has died), then the buffer's redis-server SIGKILLed, its AOF deleted (a
mistaken cleanup) and started again empty with its command line. Issue 47, item 7: every read
path answered 200 with zeros and the check said "no write was lost". Now the write path records
each write in the cache's Redis before its 201, so every path but raw answers 503 DataLost
naming the supercuboids, the same long-lived web worker included, until an operator accepts the
loss with `ndstore recover --accept-loss`; raw is the base tier as it is (zeros: nothing of
these writes was ever merged)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from ndstore.core.geometry import Box
from ndstore.ops.localstack import ROOT
from tests.faults.conftest import OCTET, Stack
from tests.faults.test_redis_kill_live import kill, start_again

pytestmark = pytest.mark.faults

FRAME = Box((0, 0, 0), (1024, 512, 16))
HALVES = (Box((0, 0, 0), (512, 512, 16)), Box((512, 0, 0), (1024, 512, 16)))  # one supercuboid each
PATHS = (("cutout", None), ("cutout", "no_cache"), ("direct/cutout", None), ("blaze/cutout", None))


def test_ndblaze_writes_lost_with_the_buffer_are_refused_on_every_path_until_accepted(stack: Stack) -> None:
    ch = stack.channel("blost", FRAME.hi)
    rng = np.random.default_rng(47)
    for box in HALVES:
        data = rng.integers(1, 256, box.shape_zyx, dtype=np.uint8)
        assert ch.write(box, data, "blaze/cutout").status_code == 201
        np.testing.assert_array_equal(ch.read_ok(box, "blaze/cutout"), data)
    assert stack.session().get(f"{stack.url}/v1/blaze/merge/").json()["merger"] is None

    port = stack.local.blaze_redis_port
    old = kill(stack, port)
    shutil.rmtree(stack.local.data_dir / "blaze-redis" / "appendonlydir")
    start_again(stack, old, port)

    for path, mode in PATHS:
        status, data, message = ch.read(FRAME, path, mode)
        assert status == 503 and data is None, (path, mode, status)
        assert "lost writes the service had acknowledged" in message and "came back without its data" in message
    r = stack.session().get(ch.url(FRAME), headers={"Accept": OCTET})
    assert len(r.json()["lost"]) == 2 and all(n.split("&")[-1] in ("0", "1") for n in r.json()["lost"])
    assert not ch.read_ok(FRAME, mode="raw").any()  # the base tier as it is
    assert ch.write(HALVES[0], np.ones(HALVES[0].shape_zyx, np.uint8), "blaze/cutout").status_code == 503

    recover = [sys.executable, "-m", "ndstore.cli", "recover", "--data-dir", str(stack.local.data_dir)]
    env = stack.local.environment()
    listing = subprocess.run(recover, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert "blost/e/c: 2 supercuboids lost acknowledged writes" in listing.stdout, listing
    subprocess.run([*recover, "--accept-loss", "--channel", "blost/e/c"], env=env, cwd=ROOT, capture_output=True,
                   check=True)
    for path, mode in PATHS:
        assert not ch.read_ok(FRAME, path, mode).any()  # served again, as the base tier holds them
    data = rng.integers(1, 256, HALVES[1].shape_zyx, dtype=np.uint8)
    assert ch.write(HALVES[1], data, "blaze/cutout").status_code == 201
    np.testing.assert_array_equal(ch.read_ok(HALVES[1], "blaze/cutout"), data)
