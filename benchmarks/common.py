"""Shared benchmark helpers: the hardware record, round statistics, result files, the ceilings
every benchmark reports beside its figures (loopback HTTP, blosc, an object store's own PUT/GET),
loopback-only servers (a blob HTTP server, moto), and a local NDStore stack with a dataset.

Every server started here binds to 127.0.0.1 and is stopped in a ``finally`` block.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import blosc
import blosc2
import numpy as np
import numpy.typing as npt
import requests

from ndstore.ops.localstack import LocalStack, free_port, wait_until
from ndstore.storage import redis_client
from ndstore.storage.redis_cache import RedisCuboidCache

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 1 << 20
ADMIN_TOKEN = "benchmark-admin-token"
AWS_TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}
Summary = dict[str, float]

# --- the record -------------------------------------------------------------------------------


def hardware() -> dict[str, Any]:
    import django

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) // 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    return {"cores": os.cpu_count(), "memory_mib": mem, "cpu": cpu, "python": platform.python_version(),
            "numpy": np.__version__, "blosc2": blosc2.__version__, "blosc": blosc.__version__,
            "django": django.__version__, "date": datetime.now(UTC).isoformat(timespec="seconds")}


def summary(values: list[float]) -> Summary:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: Summary, digits: int = 0) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


MB_PER_S = "Figures are MB/s of raw voxels: median (min–max) of the rounds."


def write_results(name: str, record: dict[str, Any], table: list[list[str]], header: list[str],
                  extra_md: str = "", units: str = MB_PER_S) -> str:
    """Write results/{name}.json and results/{name}.md (the table, then ``extra_md``); return the md."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    hw = record["hardware"]
    md = (f"# {name}\n\n{hw['cores']} cores, {hw['memory_mib']} MiB, {hw['cpu']}; Python {hw['python']}, "
          f"numpy {hw['numpy']}, blosc2 {hw['blosc2']}, Django {hw.get('django', '?')}; {hw['date']}.\n"
          f"{units}\n\n"
          + markdown_table(header, table) + "\n" + (f"\n{extra_md.strip()}\n" if extra_md else ""))
    (RESULTS / f"{name}.md").write_text(md)
    return md


# --- timing -----------------------------------------------------------------------------------


def concurrent_rate(fn: Callable[[int], int], threads: int, reps: int = 1) -> float:
    """Run fn(i) ``reps`` times in each of ``threads`` threads at once; return the total bytes
    fn reported / wall seconds, in MB/s."""
    done: list[int] = [0] * threads
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            for _ in range(reps):
                done[i] += fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(done) / elapsed / 1e6


def latencies(fn: Callable[[], object], n: int) -> dict[str, float]:
    """p50 and p99 in ms of ``n`` calls of fn, one after another."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50_ms": statistics.median(times), "p99_ms": times[int(0.99 * (len(times) - 1))], "n": n}


def timed_rate(fn: Callable[[], object], nbytes: int) -> float:
    start = time.perf_counter()
    fn()
    return nbytes / (time.perf_counter() - start) / 1e6


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``roots`` and all their descendants
    (from /proc), those that exited included: a parent's cutime/cstime holds the children it
    reaped (without them, a measurement spanning a descendant's exit once came out negative)."""
    parent, used = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid = int(entry.name)
        parent[pid], used[pid] = int(fields[1]), sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    tree, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier and pid not in tree}
        tree |= frontier
    return sum(used.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


CLIENT = "client (the benchmark's threads)"


class CpuByPart:
    """CPU seconds used between ``start()`` and ``stop()`` by each part of the machine's work: a
    process tree per named part (see ``stack_parts``), this process (the client) apart."""

    def __init__(self, parts: dict[str, list[int]]):
        self.parts = parts
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {**{name: cpu_seconds(pids) for name, pids in self.parts.items()}, CLIENT: own_cpu_seconds()}

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        return {name: end - self._start[name] for name, end in self._now().items()}


def stack_parts(stack: Stack, store_pids: list[int] | None = None) -> dict[str, list[int]]:
    """The stack's processes by what they do: web workers, front, each Redis, the daemons (and
    the Spark they start), and an object store running in processes of its own."""
    blaze_port = stack.blaze_redis_url.rsplit(":", 1)[-1].split("/")[0]
    parts: dict[str, list[int]] = {}
    for pid in stack.pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited
        part = ("web workers (gunicorn)" if "gunicorn" in cmd else "front (nginx)" if "nginx" in cmd
                else ("Redis (NDBlaze)" if cmd.rstrip().endswith(f":{blaze_port}") else "Redis (cache, locks)")
                if "redis-server" in cmd else "daemons")
        parts.setdefault(part, []).append(pid)
    if store_pids:
        parts["object store (moto)"] = list(store_pids)
    return parts


# --- client side of a cutout ------------------------------------------------------------------


def evict_all(cache: RedisCuboidCache) -> None:
    """Drop every supercuboid the cache holds, as the cache manager evicts (the Redis keeps its
    checked mark), without writing back: only for a cache that holds nothing dirty."""
    for name in cache.names_with_prefix(""):
        cache.evict(name)


def cuboid_cache(redis_url: str) -> RedisCuboidCache:
    return RedisCuboidCache(redis_client.connect(redis_url))


def read_body(session: requests.Session, url: str, headers: dict[str, str] | None = None) -> bytes:
    """GET without requests' .content overhead (stream + raw.read)."""
    with session.get(url, headers=headers, stream=True) as r:
        r.raise_for_status()
        return r.raw.read()  # type: ignore[no-any-return]


_BLOSC1_MAX_VERSION = 2


def client_decode(body: bytes, out: npt.NDArray[Any]) -> None:
    """Decode an application/blosc body into ``out`` as a client would, with the faster library
    for its format: blosc2 reads blosc1-format buffers (what python-blosc writes, and what the
    service sends) about 8x slower than python-blosc does here; blosc2 for its own format."""
    if body[0] <= _BLOSC1_MAX_VERSION:
        blosc.decompress_ptr(body, out.ctypes.data)
    else:
        blosc2.decompress2(body, dst=out)


# --- ceilings ---------------------------------------------------------------------------------


def blosc_rates(volume: npt.NDArray[Any], rounds: int) -> dict[str, Any]:
    """In-process codec ceilings on ``volume`` with the wire settings (lz4, clevel 5): python-blosc
    compress / decompress (the service's and a client's codec), and blosc2 decompress of the same
    blosc1-format buffer (a client that uses blosc2)."""
    packed = blosc.compress(volume, typesize=volume.dtype.itemsize, cname="lz4", clevel=5)
    out = np.empty_like(volume)
    runs: dict[str, Callable[[], object]] = {
        "compress": lambda: blosc.compress(volume, typesize=volume.dtype.itemsize, cname="lz4", clevel=5),
        "decompress": lambda: blosc.decompress_ptr(packed, out.ctypes.data),
        "blosc2_decompress": lambda: blosc2.decompress2(packed, dst=out),
    }
    rates: dict[str, Any] = {k: summary([timed_rate(fn, volume.nbytes) for _ in range(rounds)])
                             for k, fn in runs.items()}
    return {**rates, "ratio": len(packed) / volume.nbytes}


class _Blob(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        while n:
            n -= len(self.rfile.read(min(n, 4 * MiB)))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


SMALL = (64, 64, 8)  # x, y, z: DESIGN §8's small write, an annotation tool's stroke


def small_write_body(seed: int) -> bytes:
    """A SMALL box of random uint8 voxels as a blosc body (lz4 level 5, as the clients send)."""
    voxels = np.random.default_rng(seed).integers(0, 255, SMALL[::-1], np.uint8)
    return blosc.compress(voxels, typesize=1, cname="lz4", clevel=5)  # type: ignore[no-any-return]


def small_write_url(volume_url: str, x: int, y: int, z: int) -> str:
    """The cutout URL of the SMALL box at (x, y, z) under ``volume_url`` (.../resolution)."""
    return f"{volume_url}/{x}:{x + SMALL[0]}/{y}:{y + SMALL[1]}/{z}:{z + SMALL[2]}/"


def repeated_posts(sessions: list[requests.Session], url: str, body: bytes, count: int) -> Callable[[int], int]:
    """For concurrent_rate: thread i POSTs ``body`` to ``url`` ``count`` times with its own
    session (a small write's loopback ceiling); each call reports ``count``."""
    def post(i: int) -> int:
        for _ in range(count):
            sessions[i].post(url, data=body).raise_for_status()
        return count
    return post


class _Backlogged(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 32 writers connecting at once had their
    # connections reset. nginx, the service's front, listens with 511.
    request_queue_size = 511


@contextmanager
def loopback_http(body: bytes) -> Iterator[str]:
    """A plain threaded HTTP server on 127.0.0.1 that serves and swallows ``body``-sized bodies."""
    handler = type("Blob", (_Blob,), {"body": body})
    server = _Backlogged(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def loopback_rates(body: bytes, threads: int, rounds: int, reps: int = 1) -> dict[str, Any]:
    """GET and POST of ``body`` against a bare HTTP server (the loopback ceiling), each client
    thread with its own requests.Session, reading as read_body does."""
    with loopback_http(body) as url:
        sessions = [requests.Session() for _ in range(threads)]

        def get(i: int) -> int:
            return len(read_body(sessions[i], url))

        def post(i: int) -> int:
            sessions[i].post(url, data=body).raise_for_status()
            return len(body)

        try:
            return {"get": summary([concurrent_rate(get, threads, reps) for _ in range(rounds)]),
                    "post": summary([concurrent_rate(post, threads, reps) for _ in range(rounds)])}
        finally:
            for s in sessions:
                s.close()


def plain_wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """The tiny-request ceiling: a WSGI app that reads the body and answers, nothing else."""
    stream, n = environ["wsgi.input"], int(environ.get("CONTENT_LENGTH") or 0)
    while n > 0:
        chunk = stream.read(min(n, MiB))
        if not chunk:
            break
        n -= len(chunk)
    start_response("201 Created" if environ["REQUEST_METHOD"] == "POST" else "200 OK",
                   [("Content-Length", "1"), ("Content-Type", "application/octet-stream")])
    return [b"\0"]


@contextmanager
def plain_wsgi_server(threads: int = 4) -> Iterator[ServerProcess]:
    """`plain_wsgi` under gunicorn with the service's worker class (gthread), one worker, on a
    free 127.0.0.1 port: what a request costs with no framework, no auth and no storage."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1",
                             "--threads", str(threads), "--log-level", "warning", "benchmarks.common:plain_wsgi"],
                            cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL)
    with serving(proc, f"http://127.0.0.1:{port}/", lambda status: status == 200, "plain WSGI server") as server:
        yield server


class CeilingStore(Protocol):
    """An object store's own PUT and GET, with nothing of the service around them."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


def object_store_rates(store: CeilingStore, objects: list[bytes], region_bytes: int,
                       threads: int, reps: int = 1) -> dict[str, float]:
    """One round of PUT then GET of ``objects[i]`` by thread i, in MB/s of ``region_bytes`` per
    object (so that the rate compares with raw-voxel figures of the same regions)."""
    keys = [f"ceiling-{i}" for i in range(threads)]

    def put(i: int) -> int:
        store.put(keys[i], objects[i])
        return region_bytes

    def get(i: int) -> int:
        store.get(keys[i])
        return region_bytes

    return {"put": concurrent_rate(put, threads, reps), "get": concurrent_rate(get, threads, reps)}


# --- loopback servers -------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerProcess:
    url: str
    pid: int


@contextmanager
def moto_server() -> Iterator[ServerProcess]:
    """moto's server (as `ndstore up` runs it) on a free 127.0.0.1 port, in a process of its own,
    as a real object store would be: it must not share the client's interpreter lock."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ndstore.ops.moto_endpoint", "-p", str(port)],
                            stdout=subprocess.DEVNULL)
    with serving(proc, f"http://127.0.0.1:{port}", lambda status: status < 500, "moto server") as server:
        yield server


@contextmanager
def serving(proc: subprocess.Popen[bytes], url: str, ready: Callable[[int], bool],
             what: str) -> Iterator[ServerProcess]:
    """``proc`` once it answers ``url`` with a status ``ready`` accepts; terminated (killed after
    10 s) on the way out."""
    try:
        wait_until(lambda: proc.poll() is None and ready(requests.get(url, timeout=1).status_code), f"{what} at {url}")
        yield ServerProcess(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the service ------------------------------------------------------------------------------


@dataclass
class Stack:
    url: str
    session_headers: dict[str, str]
    redis_url: str = ""
    blaze_redis_url: str = ""
    pids: list[int] = field(default_factory=list)  # Redis servers, daemons, gunicorn (workers are its children), nginx
    gunicorn_pid: int = 0  # gunicorn's master

    def session(self) -> requests.Session:
        s = requests.Session()
        s.headers.update(self.session_headers)
        return s


@contextmanager
def local_stack(extra_env: dict[str, str], workers: int = 2, threads: int = 4,
                with_merger: bool = True) -> Iterator[Stack]:
    """`ndstore up`'s stack (Redis, daemons, gunicorn behind its nginx front) on free 127.0.0.1
    ports, data in a temporary directory, the admin token ADMIN_TOKEN; gunicorn logs warnings only."""
    with tempfile.TemporaryDirectory(prefix="ndbench-") as tmp:
        env = {"NDSTORE_ADMIN_TOKEN": ADMIN_TOKEN, "GUNICORN_CMD_ARGS": "--log-level warning", **extra_env}
        stack = LocalStack(Path(tmp), port=free_port(), workers=workers, threads=threads, extra_env=env,
                           with_merger=with_merger)
        try:
            stack.start()
            yield Stack(stack.url, {"Authorization": f"Token {ADMIN_TOKEN}"},
                        f"redis://127.0.0.1:{stack.redis_port}/0", f"redis://127.0.0.1:{stack.blaze_redis_port}/0",
                        [p.pid for p in stack.procs],
                        next(p.pid for p in stack.procs if "gunicorn" in " ".join(map(str, p.args))))
        finally:
            stack.stop()


def create_dataset(stack: Stack, frame_xyz: tuple[int, int, int], datatype: str = "uint8") -> str:
    """Create coll/exp/chan 'bench/e/c' in a frame of ``frame_xyz``; return the cutout path prefix
    'bench/e/c/0' (resolution 0)."""
    x, y, z = frame_xyz
    steps: list[tuple[str, dict[str, Any]]] = [
        ("coord/bframe/", {"x_stop": x, "y_stop": y, "z_stop": z}),
        ("collection/bench/", {}),
        ("collection/bench/experiment/e/", {"coord_frame": "bframe", "hierarchy_method": "anisotropic"}),
        ("collection/bench/experiment/e/channel/c/", {"type": "image", "datatype": datatype}),
    ]
    with stack.session() as s:
        for path, body in steps:
            r = s.post(f"{stack.url}/v1/{path}", json=body)
            if r.status_code != 201:
                raise RuntimeError(f"creating {path} answered {r.status_code}: {r.text}")
    return "bench/e/c/0"
