"""The merge job on real pyspark (local mode), with services built from settings as in a
deployment, and a merging process killed with SIGKILL halfway and merged again."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from blaze.spark_job import merge_round
from ndstore import wiring
from ndstore.core.geometry import Box
from ndstore.engine.volume import ChannelVolume
from tests.blaze.conftest import Blaze
from tests.blaze.test_blaze import reference, seed_base, whole, write_random
from tests.engine.conftest import small_channel

ROOT = Path(__file__).resolve().parents[2]


def wide_channel() -> ChannelVolume:
    """4 x 4 supercuboids of uint8 in x and y: enough merge work to interrupt."""
    probe = small_channel("uint8")
    sc = probe.grid(0).supercuboid
    return ChannelVolume(1, 1, 9, probe.dtype, Box((0, 0, 0), (4 * sc[0], 4 * sc[1], sc[2])), 1, "anisotropic", 1)


def test_spark_merge_round_equals_the_reference(wired: Blaze, spark: Any) -> None:
    assert spark.conf.get("spark.serializer") == "org.apache.spark.serializer.KryoSerializer"
    channel = small_channel("uint8")
    base = seed_base(wired, channel)
    ref = reference(channel, base, write_random(wired, channel, random.Random(21), 60))
    result = merge_round(spark, wired.buffer, partial(wiring.merger_for, wired.config))
    assert result.supercuboids == 8 and result.blobs_applied >= 60
    assert np.array_equal(wired.base.read(whole(channel))[0], ref)
    assert wired.buffer.stats().blobs == 0
    assert merge_round(spark, wired.buffer, partial(wiring.merger_for, wired.config)).supercuboids == 0


def test_a_merge_killed_halfway_loses_nothing_and_reruns_to_the_same_result(wired: Blaze) -> None:
    channel = wide_channel()
    ref = reference(channel, np.zeros(whole(channel).shape[1:], np.uint8),
                    write_random(wired, channel, random.Random(31), 120))
    before = len(wired.buffer.pending_names())
    assert before == 16
    merging = subprocess.Popen([sys.executable, "-m", "ndstore.cli", "blaze", "merge", "--master", "local[2]"],
                               cwd=ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(wired.buffer.pending_names()) == before and merging.poll() is None:
            assert time.monotonic() < deadline, "the merge never started"
            time.sleep(0.01)
        assert merging.poll() is None, "the merge finished before it could be killed"
        os.killpg(merging.pid, signal.SIGKILL)
    finally:
        merging.wait(timeout=30)
    left = len(wired.buffer.pending_names())
    assert 0 < left < before
    assert np.array_equal(wired.tier.read(whole(channel))[0], ref)  # nothing lost meanwhile
    wired.merger.merge(wired.buffer.pending_names())  # waits out the dead merger's lock leases
    assert np.array_equal(wired.base.read(whole(channel))[0], ref)
    assert wired.buffer.stats().blobs == 0
