"""The NDBlaze merge on a Spark standalone cluster (a master and a worker in JVMs of their own,
tests/conftest.py), started the way a deployment starts it: `ndstore blaze merge --master
spark://...` in a process of its own, whose executors on the worker build their services from the
NDSTORE_* settings the driver sends and merge into the base tier byte for byte."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from tests.blaze.conftest import Blaze
from tests.blaze.test_blaze import reference, seed_base, whole, write_random
from tests.conftest import SparkStandalone
from tests.engine.conftest import small_channel

ROOT = Path(__file__).resolve().parents[2]


def test_a_merge_round_on_the_standalone_cluster_is_byte_exact(wired: Blaze,
                                                               spark_standalone: SparkStandalone) -> None:
    channel = small_channel("uint16")
    base = seed_base(wired, channel)
    ref = reference(channel, base, write_random(wired, channel, random.Random(41), 40))
    pending = len(wired.buffer.pending_names())
    assert pending == 8
    before = spark_standalone.apps_named("ndstore-blaze-merge")

    merged = subprocess.run([sys.executable, "-m", "ndstore.cli", "blaze", "merge",
                             "--master", spark_standalone.url], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert merged.returncode == 0, merged.stderr[-3000:]
    result = json.loads(merged.stdout.strip().splitlines()[-1])
    assert result["supercuboids"] == pending and result["blobs_applied"] >= 40 and result["supercuboids_failed"] == 0

    # it ran on the cluster (an application of the master, its executors on the worker), not in local mode
    assert spark_standalone.apps_named("ndstore-blaze-merge") == before + 1
    got = wired.base.read(whole(channel))[0]
    assert got.dtype == ref.dtype and got.tobytes() == ref.tobytes()
    assert wired.buffer.stats().blobs == 0 and wired.buffer.pending_names() == []
