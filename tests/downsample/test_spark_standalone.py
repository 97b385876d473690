"""The hierarchy build on a Spark standalone cluster (a master and a worker in JVMs of their own,
tests/conftest.py): a driver process gives the cluster the same per-parent tasks as local mode;
executors on the worker build their services from the settings sent with the tasks, read the
children from moto's S3 and write the parents, and every level equals the numpy reference.
(Annotations take the same path; tests/downsample/test_hierarchy.py checks their mode locally.)"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ndstore.core.synthetic import em_like
from tests.conftest import SparkStandalone
from tests.downsample.test_hierarchy import channel, check_levels, stored, write_level0

pytestmark = pytest.mark.usefixtures("ingest_env")
ROOT = Path(__file__).resolve().parents[2]


def test_levels_built_on_the_standalone_cluster_equal_the_reference(spark_standalone: SparkStandalone,
                                                                   tmp_path: Path) -> None:
    img = channel("uint16", "anisotropic", (1100, 600, 20), cid=11)  # odd edges in x and y; 3 levels
    data = em_like((20, 600, 1100), seed=12).astype(np.uint16) * 250
    write_level0(img, data)  # dirty in the cache tier: the executors' reads write it back first
    (tmp_path / "channels.pickle").write_bytes(pickle.dumps([img]))
    before = spark_standalone.apps_named("ndstore-downsample")

    built = subprocess.run([sys.executable, "-m", "tests.downsample.spark_driver", spark_standalone.url,
                            str(tmp_path / "channels.pickle")], cwd=ROOT, capture_output=True, text=True,
                           timeout=240, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert built.returncode == 0, built.stderr[-3000:]
    [result] = [json.loads(line) for line in built.stdout.splitlines() if line.startswith("{")]
    assert result["state"] == "DOWNSAMPLED", result
    levels = result["levels"]
    assert set(levels) == {"1", "2"} and all(lv["done"] == lv["total"] and not lv["failed"] for lv in levels.values())
    assert spark_standalone.apps_named("ndstore-downsample") == before + 1  # it ran on the cluster

    check_levels(img, data)  # byte for byte: the same dtype, every voxel equal
    assert [len(stored(img, level)) for level in (1, 2)] == [levels["1"]["total"], levels["2"]["total"]] == [2, 1]
