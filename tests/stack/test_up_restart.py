"""`ndstore up` end to end: real redis-server, gunicorn and the on-disk stores. Stopping and
starting it again keeps every dataset and every voxel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from ndstore.ops.localstack import free_port, wait_until

TOKEN = "restart-test-admin-token"


class Up:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, merger: bool = True, settings: dict[str, str] | None = None) -> None:
        """`ndstore up` with its own defaults (not the test session's wiring), but ``settings``."""
        env = {**os.environ, "NDSTORE_ADMIN_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base"}
        for k in [k for k in env if k.startswith("NDSTORE_") and k != "NDSTORE_ADMIN_TOKEN"]:
            env.pop(k)
        env.update(settings or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ndstore.cli", "up", "--data-dir", str(self.data_dir),
             "--port", str(self.port), "--workers", "1", "--merger" if merger else "--no-merger"],
            env=env, start_new_session=True)
        if merger:
            wait_until(lambda: requests.get(f"{self.url}/v1/blaze/merge/", headers={"Authorization": f"Token {TOKEN}"},
                                            timeout=2).json()["merger"], "ndstore up, its merger included", timeout=180)
        else:
            wait_until(lambda: requests.get(f"{self.url}/healthz", timeout=2).status_code == 200, "ndstore up",
                       timeout=120)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=60) == 0

    def session(self) -> requests.Session:
        s = requests.Session()
        s.headers["Authorization"] = f"Token {TOKEN}"
        return s

    def create(self, collection: str, frame: tuple[int, int, int], channel: str, fields: dict[str, str]) -> None:
        """A coordinate frame, collection, experiment `e` and channel, each answered 201."""
        s, url = self.session(), f"{self.url}/v1"
        x, y, z = frame
        assert s.post(f"{url}/coord/{collection}_f/", json={"x_stop": x, "y_stop": y, "z_stop": z}).status_code == 201
        assert s.post(f"{url}/collection/{collection}/", json={}).status_code == 201
        assert s.post(f"{url}/collection/{collection}/experiment/e/",
                      json={"coord_frame": f"{collection}_f"}).status_code == 201
        assert s.post(f"{url}/collection/{collection}/experiment/e/channel/{channel}/", json=fields).status_code == 201


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    stack = Up(tmp_path / "data")
    yield stack
    if stack.proc:  # whatever became of `ndstore up`, none of its services outlives the test
        try:
            os.killpg(stack.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_cutouts_and_pending_blaze_writes_survive_a_restart_and_the_merger_merges_them(up: Up) -> None:
    """One stop/start cycle for both (each boot of `ndstore up` costs half a minute here). The first
    boot has no merger: nothing can merge the NDBlaze writes before the restart, and the merger's
    JVM is started once."""
    up.start(merger=False)
    s = up.session()
    up.create("keep", (700, 600, 80), "c", {"datatype": "uint16"})
    data = np.random.default_rng(0).integers(0, 60000, (70, 500, 600), dtype=np.uint16)
    url = f"{up.url}/v1/cutout/keep/e/c/0/50:650/40:540/5:75/"
    r = s.post(url, data=data.tobytes(), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    up.create("bl", (600, 600, 40), "ann", {"type": "annotation", "datatype": "uint64"})
    labels = np.random.default_rng(1).integers(1, 1 << 40, (10, 300, 400), dtype=np.uint64)
    blaze = f"{up.url}/v1/blaze/cutout/bl/e/ann/0/100:500/200:500/20:30/"
    r = s.post(blaze, data=labels.tobytes(), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    up.stop()
    # A clean stop wrote the cache tier's dirty data back to the base tier.
    assert len(list((up.data_dir / "objects").glob("*/*&1&1&1&*"))) == 12  # 2 x 2 x 3 supercuboids of uint16

    up.start()
    s = up.session()
    r = s.get(url, headers={"Accept": "application/octet-stream"})
    assert r.status_code == 200
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint16).reshape(data.shape), data)
    assert s.get(f"{up.url}/v1/collection/keep/experiment/e/channel/c/").json()["datatype"] == "uint16"
    r = s.get(blaze, headers={"Accept": "application/octet-stream"})  # the buffer's Redis kept it (AOF)
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint64).reshape(labels.shape), labels)
    request = s.post(f"{up.url}/v1/blaze/merge/")
    assert request.status_code == 202
    status = f"{up.url}{request.json()['status']}"
    wait_until(lambda: s.get(status).json()["state"] == "done", "the NDBlaze merge", timeout=120)
    assert s.get(f"{up.url}/v1/blaze/merge/").json()["pending"]["blobs"] == 0
    r = s.get(blaze.replace("/blaze/", "/direct/"), headers={"Accept": "application/octet-stream"})
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint64).reshape(labels.shape), labels)
    up.stop()


def test_an_ingest_interrupted_by_a_restart_of_the_whole_stack_resumes_to_the_exact_volume(up: Up,
                                                                                        tmp_path: Path) -> None:
    """The local default keeps ingest state under the data dir (SQLite queues and job state, the
    tile directory): stop `ndstore up` in the middle of an upload, start it again, and
    `ndstore ingest --job N` finishes the job."""
    from ndstore.core.geometry import Box
    from tests.ingest.conftest import source_volume
    from tests.ingest.test_client_e2e import write_tiles

    box = Box((0, 0, 0), (1024, 768, 16))  # 192 tiles of 256, 4 supercuboids (one all zero)
    volume = source_volume(box)
    write_tiles(tmp_path / "tiles", volume)
    # ingest needs no NDBlaze merger; the tasks the killed client held come back after the
    # visibility timeout (60 s by default): 10 s here, so the rerun does not wait a minute
    quick_leases = {"NDSTORE_INGEST_VISIBILITY_S": "10"}
    up.start(merger=False, settings=quick_leases)
    up.create("ing", (1024, 1024, 80), "c", {"datatype": "uint8"})

    def ingest(*args: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "ndstore.cli", "ingest", "--server", up.url, "--token", TOKEN,
               "--processes", "2", "--no-progress", "--tiles", str(tmp_path / "tiles"), *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    def status(job: int) -> Any:
        return up.session().get(f"{up.url}/v1/ingest/{job}/").json()["status"]

    first = ingest("--channel", "ing/e/c", "--x", "0:1024", "--y", "0:768", "--z", "0:16", "--tile-size", "256")
    wait_until(lambda: up.session().get(f"{up.url}/v1/ingest/").json()["jobs"], "the job", timeout=60)
    job = up.session().get(f"{up.url}/v1/ingest/").json()["jobs"][0]["id"]
    wait_until(lambda: status(job)["tiles"]["uploaded"] >= 30, "30 tiles recorded", timeout=120)
    up.stop()  # the whole stack, mid-upload
    os.killpg(first.pid, signal.SIGKILL)  # its client lost the service; a lab would run it again
    first.wait()

    up.start(merger=False, settings=quick_leases)
    before = status(job)
    assert 30 <= before["tiles"]["uploaded"] < 192, before
    second = ingest("--job", str(job))
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    wait_until(lambda: status(job)["supercuboids"]["cleaned"] == 4, "every supercuboid built", timeout=120)
    assert status(job)["tiles"] == {"total": 192, "uploaded": 192, "queued_for_upload": 192}
    r = up.session().get(f"{up.url}/v1/cutout/ing/e/c/0/0:1024/0:768/0:16/",
                         headers={"Accept": "application/octet-stream"})
    np.testing.assert_array_equal(np.frombuffer(r.content, np.uint8).reshape(volume.shape), volume)
    assert up.session().post(f"{up.url}/v1/ingest/{job}/complete/").json()["state"] == "complete"
    up.stop()
