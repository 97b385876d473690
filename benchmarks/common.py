"""Shared benchmark helpers: hardware record, statistics, result files, ceilings, a local stack."""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from ndstore.client.localstack import LocalStack, free_port

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 1 << 20
ADMIN_TOKEN = "benchmark-admin-token"


def hardware() -> dict[str, Any]:
    import blosc2
    import django
    import numpy

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) // 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    return {"cores": os.cpu_count(), "memory_mib": mem, "cpu": cpu, "python": platform.python_version(),
            "numpy": numpy.__version__, "blosc2": blosc2.__version__, "django": django.__version__,
            "date": datetime.now(UTC).isoformat(timespec="seconds")}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"


def concurrent_rate(fn: Callable[[int], int], threads: int) -> float:
    """Run fn(i) in ``threads`` threads at once; return the total bytes / wall seconds in MB/s."""
    done: list[int] = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        barrier.wait()
        done[i] = fn(i)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    return sum(done) / (time.perf_counter() - start) / 1e6


def write_results(name: str, record: dict[str, Any], table: list[list[str]], header: list[str]) -> str:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    hw = record["hardware"]
    md = (f"# {name}\n\n{hw['cores']} cores, {hw['memory_mib']} MiB, {hw['cpu']}; Python {hw['python']}, "
          f"numpy {hw['numpy']}, blosc2 {hw['blosc2']}; {hw['date']}.\n"
          "Figures are MB/s of raw voxels: median (min–max) of the rounds.\n\n" + "\n".join(lines) + "\n")
    (RESULTS / f"{name}.md").write_text(md)
    return md


class _Blob(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers["Content-Length"])
        while n:
            n -= len(self.rfile.read(min(n, 4 * MiB)))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def loopback_http(body: bytes) -> Iterator[str]:
    """A plain threaded HTTP server on 127.0.0.1 that serves and swallows ``body``-sized bodies."""
    handler = type("Blob", (_Blob,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def read_body(session: requests.Session, url: str, headers: dict[str, str] | None = None) -> bytes:
    """GET without requests' .content overhead (stream + raw.read)."""
    with session.get(url, headers=headers, stream=True) as r:
        r.raise_for_status()
        return r.raw.read()  # type: ignore[no-any-return]


@dataclass
class Stack:
    url: str
    session_headers: dict[str, str]
    redis_url: str = ""

    def session(self) -> requests.Session:
        s = requests.Session()
        s.headers.update(self.session_headers)
        return s


@contextmanager
def local_stack(extra_env: dict[str, str], workers: int = 2, threads: int = 4) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="ndbench-") as tmp:
        env = {"NDSTORE_ADMIN_TOKEN": ADMIN_TOKEN, **extra_env}
        stack = LocalStack(Path(tmp), port=free_port(), workers=workers, threads=threads, extra_env=env)
        try:
            stack.start()
            yield Stack(stack.url, {"Authorization": f"Token {ADMIN_TOKEN}"},
                        f"redis://127.0.0.1:{stack.redis_port}/0")
        finally:
            stack.stop()


def create_dataset(stack: Stack, frame_xyz: tuple[int, int, int], datatype: str = "uint8") -> str:
    """Create coll/exp/chan 'bench/e/c'; return the cutout prefix `/v1/{path}cutout/bench/e/c/0/`."""
    s = stack.session()
    x, y, z = frame_xyz
    for path, body in [("coord/bframe/", {"x_stop": x, "y_stop": y, "z_stop": z}), ("collection/bench/", {}),
                       ("collection/bench/experiment/e/", {"coord_frame": "bframe"}),
                       ("collection/bench/experiment/e/channel/c/", {"datatype": datatype})]:
        r = s.post(f"{stack.url}/v1/{path}", json=body)
        assert r.status_code == 201, r.text
    return "bench/e/c/0"
