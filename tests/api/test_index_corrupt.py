"""The SQLite supercuboid index damaged while the service was stopped: overwritten with garbage, or
truncated. On main every start (the prepare step of `ndstore up`, a web worker's services, the
daemons) died in the services' build with a raw sqlite3.DatabaseError traceback and no hint.
Now the first start to open it moves the file aside (kept for forensics), begins an empty index,
marks it stale and says so in one line naming the file, what is wrong and `ndstore reindex`; the
service serves reads and writes (and a label channel's boundingbox, from its label index),
refuses what lists stored supercuboids (503 IndexStale), and `ndstore reindex` rebuilds the index
from the object store."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rest_framework.test import APIClient

from ndstore.ops.localstack import ROOT
from tests.api.conftest import make_dataset
from tests.api.test_channel_purge import channel_prefix, leftovers

OCTET = "application/octet-stream"
BBOX = "/v1/boundingbox/cx/e1/ann/0/7/?type=tight"


@pytest.fixture
def file_and_sqlite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The local default's stores under a data dir of the test's own; yields the index file."""
    from ndstore import wiring

    for name, value in {"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite",
                        "NDSTORE_DATA_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    wiring.services.cache_clear()
    yield wiring.services().config.index_path
    wiring.services.cache_clear()


def damage(index: Path, how: str) -> bytes:
    """The index file checkpointed (nothing left in its WAL), then overwritten with garbage or cut
    to half its length in place. Returns what it then holds."""
    with sqlite3.connect(index) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = index.stat().st_size
    with open(index, "r+b") as f:
        if how == "garbage":
            f.write(np.random.default_rng(3).integers(0, 256, size, np.uint8).tobytes())
        else:
            f.truncate(size // 2)
    return index.read_bytes()


def start_finds_it(where: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """A start after the damage: `ndstore up`'s prepare step (its own process) or a web worker's
    services build (this process). Returns the lines it said about the index."""
    from ndstore import wiring

    wiring.services.cache_clear()
    if where == "prepare":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "django", "ndstore_prepare"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        said = done.stderr.splitlines()
    else:
        with caplog.at_level(logging.WARNING):
            wiring.services()
        said = [r.getMessage() for r in caplog.records]
    return [line for line in said if "index" in line.lower()]


@pytest.mark.parametrize(("how", "where"), [("garbage", "prepare"), ("truncated", "worker")])
def test_a_damaged_index_is_set_aside_marked_stale_said_once_and_rebuilt_by_reindex(
        admin: APIClient, file_and_sqlite: Path, caplog: pytest.LogCaptureFixture, how: str, where: str) -> None:
    from ndstore.ops.cli import commands

    index = file_and_sqlite
    make_dataset(admin, "cx", frame=(1100, 700, 16), levels=2, channels={"img8": "uint8", "ann": "uint64"})
    image = np.random.default_rng(4).integers(1, 255, (16, 700, 1100), np.uint8)
    labels = np.zeros((8, 200, 300), np.uint64)
    labels[3:5, 100:150, 100:200] = 7
    for url, data in (("/v1/direct/cutout/cx/e1/img8/0/0:1100/0:700/0:16/", image),
                      ("/v1/direct/cutout/cx/e1/ann/0/800:1100/500:700/0:8/", labels)):
        assert admin.post(url, data.tobytes(), content_type=OCTET).status_code == 201
    damaged = damage(index, how)

    said = start_finds_it(where, caplog)
    assert len(said) == 1, said
    assert str(index) in said[0] and "moved aside" in said[0] and "`ndstore reindex`" in said[0], said
    assert ("file is not a database" if how == "garbage" else "malformed") in said[0], said
    [kept] = [p for p in index.parent.glob(f"{index.name}.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert kept.read_bytes() == damaged  # kept as found, for forensics

    # a label channel's boundingbox answers from its label index, which the damage did not touch
    assert admin.get(BBOX).json() == {"x_range": [900, 1000], "y_range": [600, 650], "z_range": [3, 5],
                                      "t_range": [0, 1]}
    for refused in (admin.post("/v1/downsample/cx/e1/img8/"),
                    admin.delete("/v1/collection/cx/experiment/e1/channel/img8/")):
        assert refused.status_code == 503, refused.content
        assert "damaged" in refused.json()["message"] and "ndstore reindex" in refused.json()["message"]
    r = admin.get("/v1/cutout/cx/e1/img8/0/0:1100/0:700/0:16/", HTTP_ACCEPT=OCTET)
    assert r.status_code == 200 and r.content == image.tobytes()  # reads and writes go on
    assert admin.post("/v1/direct/cutout/cx/e1/img8/0/0:64/0:64/0:8/", np.full((8, 64, 64), 9, np.uint8).tobytes(),
                      content_type=OCTET).status_code == 201

    done = CliRunner().invoke(commands, ["reindex"])
    assert done.exit_code == 0 and "indexed 7 stored supercuboids" in done.output, done.output
    assert admin.get(BBOX).json() == {"x_range": [900, 1000], "y_range": [600, 650], "z_range": [3, 5],
                                      "t_range": [0, 1]}
    prefix = channel_prefix("cx", "img8")
    assert admin.delete("/v1/collection/cx/experiment/e1/channel/img8/").status_code == 204
    assert leftovers(prefix)["objects"] == []
