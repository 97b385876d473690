"""`ndstore ingest` killed by its pid alone (`kill`, `kill -9`): its uploader processes must die
with it. Before, they were daemonic multiprocessing children, which only a clean exit of the
parent stops: killed, the client left its 4 uploaders leasing tasks for good, each with a socket.

The real CLI runs in a process of its own against a stub of the service's ingest routes on
loopback (a job that never finishes: every lease answers no task, slowly), so the uploaders are
alive and busy when the parent is killed. Processes are found through /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ndstore.ops.processes import wait_until

pytestmark = pytest.mark.faults

JOB = {"id": 1, "state": "uploading", "tile_count": 4, "box": {"x": [0, 512], "y": [0, 512], "z": [0, 1]},
       "tile_size": {"x": 256, "y": 256}, "status": {"tiles": {"uploaded": 0, "queued_for_upload": 0},
                                                     "queues": {"upload": {"waiting": 1, "in_flight": 0}}}}


LEASERS: set[int] = set()  # the client ports that asked for a lease


class _Stub(BaseHTTPRequestHandler):
    """GET the job: always uploading; POST a lease: no task, after a pause (an uploader waits
    on its socket meanwhile)."""

    def _answer(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(JOB)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        LEASERS.add(self.client_address[1])  # an uploader's own connection: it runs its loop
        time.sleep(0.3)
        self._answer({"tasks": [], "total": 4, "queued": 0, "waiting": 0, "leased": 0, "done": False})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children of its threads, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds processes through Linux's /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["kill", "kill -9"])
def test_the_uploaders_die_with_the_client_killed_by_its_pid(stub: str, tmp_path: Path, sig: signal.Signals) -> None:
    children: set[int] = set()
    cli = subprocess.Popen([sys.executable, "-m", "ndstore.cli", "ingest", "--server", stub, "--token", "t",
                            "--job", "1", "--tiles", str(tmp_path), "--processes", "4", "--no-progress"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    LEASERS.clear()
    try:
        # the uploaders (and multiprocessing's resource tracker) are up and past their start (on a
        # loaded host a process may take seconds to import what it runs before it asks for a lease)
        wait_until(lambda: len(descendants(cli.pid)) >= 5, "the client's uploader processes to start", 60)
        wait_until(lambda: len(LEASERS) >= 4, "every uploader to ask for a lease", 60)
        children.update(descendants(cli.pid))
        cli.send_signal(sig)  # the client alone, not its process group
        cli.wait(30)
        wait_until(lambda: not any(alive(p) for p in children), "the uploaders to die with their parent", 10)
    finally:
        if cli.poll() is None:
            cli.kill()
        for pid in children:  # what the test started, should it have failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
