"""`ndstore ingest` end to end: a live service (gunicorn, the ingest runner's worker processes,
Redis) on loopback, moto's server as S3/SQS/DynamoDB, PNG tiles on disk, the real CLI in a
process of its own; killed halfway and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from ndstore.core.geometry import Box
from ndstore.core.tiles import encode_tile
from ndstore.ops.localstack import LocalStack, free_port, wait_until
from tests.conftest import own_stack_env
from tests.ingest.conftest import source_volume

TOKEN = "ingest-e2e-admin-token"
# a job's status reads ~13 things of SQS and DynamoDB, which moto (in this process) computes
# slowly: polled every 0.3 s, not every 0.1 s
STATUS_EVERY_S = 0.3
BOX = Box((0, 0, 0), (1024, 768, 16))  # 4 x 3 tiles of 256 per slice: 192 tiles, 4 supercuboids (one all zero)


@pytest.fixture(scope="module")
def live(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    suffix = uuid.uuid4().hex[:10]
    env = {"NDSTORE_ADMIN_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base",
           "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_LOCKS": "redis",
           "NDSTORE_INGEST_ENDPOINT_URL": moto_endpoint, "NDSTORE_TILE_BUCKET": f"tiles-{suffix}",
           "NDSTORE_TILE_INDEX_TABLE": f"tiles-{suffix}", "NDSTORE_INGEST_QUEUE_PREFIX": f"e2e-{suffix}",
           # how long a leased task stays invisible: a batch of 10 tiles took longer than 10 s to
           # upload on a loaded CI host, and its tasks were leased and uploaded again (279 uploads
           # of 192 tiles); the resumed run waits at most this long for a killed run's leases
           "NDSTORE_INGEST_VISIBILITY_S": "30", "NDSTORE_INGEST_WORKERS": "2",
           "GUNICORN_CMD_ARGS": "--log-level warning"}
    stack = LocalStack(tmp_path_factory.mktemp("ingest-stack"), port=free_port(), workers=1, threads=4,
                       extra_env=own_stack_env(env), with_merger=False)
    stack.start()
    yield stack
    stack.stop()


def session() -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Token {TOKEN}"
    return s


def make_channel(url: str, name: str) -> None:
    s = session()
    for path, body in ((f"coord/{name}_f/", {"x_stop": 1024, "y_stop": 1024, "z_stop": 80}),
                       (f"collection/{name}/", {}),
                       (f"collection/{name}/experiment/e/", {"coord_frame": f"{name}_f", "num_hierarchy_levels": 2}),
                       (f"collection/{name}/experiment/e/channel/c/", {"datatype": "uint8"})):
        r = s.post(f"{url}/v1/{path}", json=body)
        assert r.status_code == 201, r.text


def write_tiles(root: Path, volume: np.ndarray) -> None:
    for z in range(volume.shape[0]):
        (root / f"{z:04d}").mkdir(parents=True, exist_ok=True)
        for y in range(volume.shape[1] // 256):
            for x in range(volume.shape[2] // 256):
                tile = volume[z, y * 256:(y + 1) * 256, x * 256:(x + 1) * 256]
                (root / f"{z:04d}" / f"{y}_{x}.png").write_bytes(encode_tile(tile, "png"))


def ingest_cli(url: str, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "ndstore.cli", "ingest", "--server", url, "--token", TOKEN,
           "--processes", "3", "--no-progress", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def job_status(url: str, job_id: int) -> dict[str, Any]:
    return session().get(f"{url}/v1/ingest/{job_id}/").json()  # type: ignore[no-any-return]


def test_the_upload_client_killed_halfway_resumes_and_the_volume_arrives_whole(live: LocalStack,
                                                                                 tmp_path: Path) -> None:
    make_channel(live.url, "ing")
    volume = source_volume(BOX)
    write_tiles(tmp_path / "tiles", volume)
    first = ingest_cli(live.url, "--channel", "ing/e/c", "--x", "0:1024", "--y", "0:768", "--z", "0:16",
                       "--tile-size", "256", "--tiles", str(tmp_path / "tiles"))
    wait_until(lambda: session().get(f"{live.url}/v1/ingest/").json()["jobs"], "the job", timeout=60)
    job_id = session().get(f"{live.url}/v1/ingest/").json()["jobs"][0]["id"]
    wait_until(lambda: job_status(live.url, job_id)["status"]["tiles"]["uploaded"] >= 40, "40 tiles", timeout=120,
               every_s=STATUS_EVERY_S)
    os.killpg(first.pid, signal.SIGKILL)  # the lab's machine dies: uploaders and all
    first.wait()
    before = job_status(live.url, job_id)["status"]["tiles"]["uploaded"]
    assert before < 192

    second = ingest_cli(live.url, "--job", str(job_id), "--tiles", str(tmp_path / "tiles"))
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    summary = _summary(out)
    assert summary["failed"] == []
    # no tile lost, and none needed twice: only the ones the first run had not got recorded, plus
    # the few its killed uploaders held (at most 10 each), went up again
    assert summary["uploaded"] + before <= 192 + 3 * 10, summary
    deadline = time.monotonic() + 120
    while (status := job_status(live.url, job_id)["status"])["supercuboids"]["cleaned"] < 4:
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert status["tiles"] == {"total": 192, "uploaded": 192, "queued_for_upload": 192}
    got = session().get(f"{live.url}/v1/cutout/ing/e/c/0/0:1024/0:768/0:16/",
                        headers={"Accept": "application/octet-stream"})
    assert got.status_code == 200
    assert np.array_equal(np.frombuffer(got.content, np.uint8).reshape(volume.shape), volume)

    done = session().post(f"{live.url}/v1/ingest/{job_id}/complete/")
    assert done.status_code == 200, (done.text, json.dumps(job_status(live.url, job_id)["status"]))
    assert done.json()["state"] == "complete"
    again = ingest_cli(live.url, "--job", str(job_id), "--tiles", str(tmp_path / "tiles"))
    out, _ = again.communicate(timeout=120)
    assert again.returncode != 0 and "complete" in out

    # then the hierarchy, through the service's queues and the stack's runner
    built = subprocess.run([sys.executable, "-m", "ndstore.cli", "downsample", "ing/e/c", "--server", live.url,
                            "--token", TOKEN, "--no-progress"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert '"status": "DOWNSAMPLED"' in built.stdout
    level1 = session().get(f"{live.url}/v1/cutout/ing/e/c/1/0:512/0:384/0:16/",
                           headers={"Accept": "application/octet-stream"})
    got = np.frombuffer(level1.content, np.uint8).reshape(16, 384, 512)
    expect = volume.reshape(16, 384, 2, 512, 2).astype(np.float64).mean(axis=(2, 4))
    assert np.array_equal(got, np.floor(expect + 0.5).astype(np.uint8))


def test_missing_and_malformed_tiles_are_named_and_the_rest_arrives(live: LocalStack, tmp_path: Path) -> None:
    make_channel(live.url, "ing2")
    volume = source_volume(Box((0, 0, 0), (512, 512, 4)))
    root = tmp_path / "tiles"
    write_tiles(root, volume)
    (root / "0002" / "1_1.png").unlink()
    (root / "0003" / "0_1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    proc = ingest_cli(live.url, "--channel", "ing2/e/c", "--x", "0:512", "--y", "0:512", "--z", "0:4",
                      "--tile-size", "256", "--tiles", str(root))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert "0002/1_1.png cannot be read: No such file or directory" in out
    assert "not a readable PNG/TIFF image" in out
    assert "2 tiles failed" in out and "--retry-failed" in out
    job_id = _summary(out)["job"]
    status = job_status(live.url, job_id)["status"]
    assert status["queues"]["upload"]["failed"] == 2 and len(status["failed_tiles"]) == 2
    blank = session().get(f"{live.url}/v1/cutout/ing2/e/c/0/0:512/0:512/0:4/",
                          headers={"Accept": "application/octet-stream"})
    assert not np.frombuffer(blank.content, np.uint8).any()  # the supercuboid waits for its last tiles
    assert session().post(f"{live.url}/v1/ingest/{job_id}/complete/").status_code == 409

    write_tiles(root, volume)  # the lab fixes the files
    proc = ingest_cli(live.url, "--job", str(job_id), "--retry-failed", "--tiles", str(root))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    wait_until(lambda: job_status(live.url, job_id)["status"]["supercuboids"]["cleaned"] == 1, "the build", 120,
               every_s=STATUS_EVERY_S)
    got = session().get(f"{live.url}/v1/cutout/ing2/e/c/0/0:512/0:512/0:4/",
                        headers={"Accept": "application/octet-stream"})
    assert np.array_equal(np.frombuffer(got.content, np.uint8).reshape(volume.shape), volume)

    # the hierarchy on Spark, run by the CLI against the stack's data dir and settings
    built = subprocess.run([sys.executable, "-m", "ndstore.cli", "downsample", "ing2/e/c", "--engine", "spark",
                            "--master", "local[2]", "--data-dir", str(live.data_dir), "--no-progress"],
                           capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if not k.startswith("NDSTORE_")})
    assert built.returncode == 0, built.stdout + built.stderr
    assert '"state": "DOWNSAMPLED"' in built.stdout
    level1 = session().get(f"{live.url}/v1/cutout/ing2/e/c/1/0:256/0:256/0:4/",
                           headers={"Accept": "application/octet-stream"})
    expect = volume.reshape(4, 256, 2, 256, 2).astype(np.float64).mean(axis=(2, 4))
    assert np.array_equal(np.frombuffer(level1.content, np.uint8).reshape(4, 256, 256),
                          np.floor(expect + 0.5).astype(np.uint8))
    channel = session().get(f"{live.url}/v1/collection/ing2/experiment/e/channel/c/").json()
    assert channel["downsample_status"] == "DOWNSAMPLED"


def _summary(out: str) -> dict[str, Any]:
    import json

    start = out.index('{\n "job"')
    depth = 0
    for i, ch in enumerate(out[start:], start):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return json.loads(out[start:i + 1])  # type: ignore[no-any-return]
    raise AssertionError(f"no summary in {out}")
