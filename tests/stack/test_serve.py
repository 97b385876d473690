"""`ndstore serve`, the image's command: the front on --bind, gunicorn behind it on a Unix socket
under the data dir, both stopped by one SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from ndstore.ops.localstack import ROOT, free_port, wait_until
from tests.conftest import own_stack_env


def test_serve_runs_the_front_before_gunicorn_and_stops_both(tmp_path: Path, redis_url: str) -> None:
    port = free_port()
    env = {**os.environ, "NDSTORE_DATA_DIR": str(tmp_path), "NDSTORE_REDIS_URL": redis_url,
           "NDSTORE_BLAZE_REDIS_URL": redis_url, "NDSTORE_WEB_WORKERS": "1",
           "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base",
           "NDSTORE_ACCESS_LOG": str(tmp_path / "access.log")}
    proc = subprocess.Popen([sys.executable, "-m", "ndstore.cli", "serve", "--bind", f"127.0.0.1:{port}"],
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        answer = wait_until_answered(f"http://127.0.0.1:{port}/healthz")
        assert answer.status_code in (200, 503) and "parts" in answer.json()  # gunicorn answered, via nginx
        assert answer.headers["Server"].startswith("nginx")
        assert (tmp_path / "front" / "web.sock").is_socket()
        assert "proxy_request_buffering on;" in (tmp_path / "front" / "nginx.conf").read_text()
        # gunicorn's access log survives Django's logging config (which once emptied it)
        requests.get(f"http://127.0.0.1:{port}/healthz?logged=1", timeout=5)
        wait_until(lambda: "/healthz?logged=1" in (tmp_path / "access.log").read_text(),
                   "an access log line", timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        left = subprocess.run(["pgrep", "-f", str(tmp_path / "front")], capture_output=True, text=True).stdout
        assert not left.strip(), left  # nginx stopped with it
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_until_answered(url: str) -> requests.Response:
    answers: list[requests.Response] = []

    def answered() -> bool:
        r = requests.get(url, timeout=5)
        if r.status_code == 502:  # the front is up, gunicorn not yet
            return False
        answers.append(r)
        return True

    wait_until(answered, f"ndstore serve at {url}", timeout=60)
    return answers[-1]


def test_a_web_service_that_dies_at_start_fails_the_start_at_once(tmp_path: Path) -> None:
    """`ndstore up` names the failure as soon as gunicorn exits (it waited out its 60 s before)
    and leaves nothing running."""
    from ndstore.ops.localstack import LocalStack
    from ndstore.ops.processes import StartFailed

    stack = LocalStack(tmp_path, port=free_port(), workers=1, threads=2, with_merger=False, with_runner=False,
                       extra_env=own_stack_env({"GUNICORN_CMD_ARGS": "--no-such-flag"}))
    started = time.monotonic()
    with pytest.raises(StartFailed, match="exited during start-up"):
        stack.start()
    assert time.monotonic() - started < 30
    assert stack.procs == []
