"""The local stack crashes holding acknowledged writes it has not written back, and its cache
Redis's AOF is deleted before the next start (a mistaken cleanup). On main the next start served
zeros with 200 for every such write; now the start finds the loss, the service refuses those
supercuboids with a 503 naming it, and `ndstore recover` lists them and accepts the loss."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests

from ndstore.engine.ledger import LEDGER_KEYS, Ledger
from ndstore.ops.localstack import ROOT, LocalStack, free_port, wait_until
from tests.conftest import own_stack_env

TOKEN = "loss-test-admin-token"
OCTET = "application/octet-stream"


def stack(data_dir: Path) -> LocalStack:
    return LocalStack(data_dir, port=free_port(), workers=1, threads=2, with_merger=False, with_runner=False,
                      extra_env=own_stack_env({"NDSTORE_ADMIN_TOKEN": TOKEN, "NDSTORE_FLUSH_AGE_S": "3600",
                                               "NDSTORE_FLUSH_INTERVAL_S": "0.2"}))


def crash(local: LocalStack) -> None:
    """Every process of the stack, their children too (nginx's worker, the task runner's pool),
    killed at once: nothing gets to write back or say goodbye, and nothing outlives the test."""
    doomed = []
    for proc in local.procs:
        if proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                doomed += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for process in doomed:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(doomed, timeout=10)
    for proc in local.procs:
        proc.wait(timeout=10)


def ledger(data_dir: Path) -> Ledger | None:
    key = LEDGER_KEYS["cache"]
    path = data_dir / "objects" / key[:2] / key
    return Ledger.from_json(path.read_bytes()) if path.exists() else None


def test_a_start_after_the_cache_redis_lost_unflushed_writes_refuses_them_until_recover(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NDSTORE_")]:
        monkeypatch.delenv(name)  # the stack's own defaults (file store, SQLite index), not the session's wiring
    data_dir = tmp_path / "data"
    first = stack(data_dir)
    first.start()
    try:
        s = requests.Session()
        s.headers["Authorization"] = f"Token {TOKEN}"
        url = f"{first.url}/v1"
        for path, body in (("coord/f/", {"x_stop": 512, "y_stop": 512, "z_stop": 16}), ("collection/c/", {}),
                           ("collection/c/experiment/e/", {"coord_frame": "f"}),
                           ("collection/c/experiment/e/channel/ch/", {"datatype": "uint8"})):
            assert s.post(f"{url}/{path}", json=body).status_code == 201
        cutout = "cutout/c/e/ch/0/0:512/0:512/0:16/"
        data = np.random.default_rng(1).integers(1, 255, (16, 512, 512), np.uint8)
        assert s.post(f"{url}/{cutout}", data=data.tobytes(), headers={"Content-Type": OCTET}).status_code == 201
        wait_until(lambda: (ledger(data_dir) or Ledger("", 0, {}, 0)).unflushed, "the flusher's ledger of it")
    finally:
        crash(first)

    shutil.rmtree(data_dir / "redis" / "appendonlydir")

    second = stack(data_dir)
    second.start()
    try:
        s = requests.Session()
        s.headers["Authorization"] = f"Token {TOKEN}"
        r = s.get(f"{second.url}/v1/{cutout}", headers={"Accept": OCTET})
        assert r.status_code == 503, r.status_code
        assert "lost writes the service had acknowledged" in r.json()["message"]
        assert s.get(f"{second.url}/v1/direct/{cutout}", headers={"Accept": OCTET}).status_code == 503

        recover = [sys.executable, "-m", "ndstore.cli", "recover", "--data-dir", str(data_dir)]
        env = second.environment()
        listing = subprocess.run(recover, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        assert "c/e/ch: " in listing.stdout and "came back without its data" in listing.stdout, listing
        subprocess.run([*recover, "--accept-loss"], env=env, cwd=ROOT, capture_output=True, check=True)
        r = s.get(f"{second.url}/v1/{cutout}", headers={"Accept": OCTET})
        assert r.status_code == 200 and not np.frombuffer(r.content, np.uint8).any()  # the loss, accepted
    finally:
        second.stop()
