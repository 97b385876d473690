"""Chunk views at the speed of a static file server (issue 50): NDStore's /zarr/, /precomputed/ and
/precomputed-sharded/ views beside a static copy of the same files served by nginx, in the same
run, by the same clients, each figure as a ratio to static (1.0 = as fast as static, higher is
better):

- TensorStore reading the whole level 0 (zarr3, neuroglancer_precomputed unsharded and sharded,
  over HTTP; zarr3 from the copy's files through the `file` kvstore as a further ceiling);
- CloudVolume reading it whole (precomputed://, one process, one thread and its default 20);
- sequential single-chunk GETs (p50, p99) of random zarr and precomputed chunks;
- Neuroglancer in headless Chromium drawing a 4-panel view of each source, from setting the
  view's state (the app already loaded) to every visible chunk on the GPU.

The copy is made by GETting from NDStore every file a reader needs, so it holds the bytes the
server serves in this run (whatever its codec). NDStore is read with the admin token; for the
Neuroglancer part the collection is made public (Neuroglancer sends no token).

    python -m benchmarks.bench_views [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests
import tensorstore as ts

from benchmarks.common import (
    ADMIN_TOKEN,
    create_dataset,
    fmt,
    hardware,
    latencies,
    local_stack,
    read_body,
    serving,
    summary,
    write_results,
)
from ndstore.client import Volume
from ndstore.core.synthetic import em_like
from ndstore.ops.front import nginx_executable
from ndstore.ops.localstack import free_port

CHANNEL = "bench/e/c"
CHROMIUM = os.environ.get("NDSTORE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
CORS = {"Access-Control-Allow-Origin": "*",  # as ndstore.api.browser_http answers the views
        "Access-Control-Expose-Headers": "Content-Range, Content-Length, Content-Encoding, Content-Type, ETag, "
                                         "Cache-Control, Accept-Ranges",
        "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
        "Access-Control-Allow-Headers": "Authorization, Content-Type, Range, If-None-Match, If-Range, Cache-Control"}
QUIET_S = 0.3  # Neuroglancer is done once ready for this long
VIEW_TIMEOUT_S = 120


@dataclass(frozen=True)
class Server:
    name: str  # "ndstore" or "static"
    url: str
    headers: dict[str, str]

    def header_lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.headers.items()]


# --- the volume and its static copy -----------------------------------------------------------


def write_volume(url: str, frame: tuple[int, int, int]) -> np.ndarray:
    """An EM-like uint8 volume written through the cache tier (so it is hot); returned (z, y, x)."""
    voxels = em_like(frame[::-1], seed=5)
    Volume(url, CHANNEL, token=ADMIN_TOKEN, parallel=2, progress_bytes=1 << 62)[:, :, :] = voxels
    return voxels


def copy_file(session: requests.Session, base: str, root: Path, path: str) -> int:
    """GET base/path into root/path; a 404 leaves it absent. Returns the bytes written."""
    r = session.get(f"{base}/{path}", timeout=60)
    if r.status_code == 404:
        return 0
    r.raise_for_status()
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_bytes(r.content)
    return len(r.content)


def zarr_files(session: requests.Session, base: str) -> list[str]:
    prefix = f"zarr/{CHANNEL}"
    array = session.get(f"{base}/{prefix}/0/zarr.json", timeout=30).json()
    chunk = array["chunk_grid"]["configuration"]["chunk_shape"]
    grid = [range(-(-n // c)) for n, c in zip(array["shape"], chunk)]
    return [f"{prefix}/zarr.json", f"{prefix}/0/zarr.json",
            *(f"{prefix}/0/c/" + "/".join(map(str, at)) for at in itertools.product(*grid))]


def precomputed_files(session: requests.Session, base: str) -> list[str]:
    prefix = f"precomputed/{CHANNEL}"
    scale = session.get(f"{base}/{prefix}/info", timeout=30).json()["scales"][0]
    lo, size, step = scale["voxel_offset"], scale["size"], scale["chunk_sizes"][0]
    spans = [[(a, min(a + s, o + n)) for a in range(o, o + n, s)] for o, n, s in zip(lo, size, step)]
    return [f"{prefix}/info", *(f"{prefix}/{scale['key']}/{x0}-{x1}_{y0}-{y1}_{z0}-{z1}"
                                 for (z0, z1), (y0, y1), (x0, x1) in itertools.product(*spans[::-1]))]


def sharded_files(session: requests.Session, base: str) -> list[str]:
    """info and every shard file of scale 0, named as Neuroglancer names them (hex, zero-padded
    to shard_bits / 4 digits)."""
    prefix = f"precomputed-sharded/{CHANNEL}"
    scale = session.get(f"{base}/{prefix}/info", timeout=30).json()["scales"][0]
    bits = scale["sharding"]["shard_bits"]
    return [f"{prefix}/info", *(f"{prefix}/{scale['key']}/{shard:0{-(-bits // 4)}x}.shard"
                                 for shard in range(1 << bits))]


def make_copy(server: Server, root: Path) -> dict[str, Any]:
    """The static copy of every file a reader of level 0 needs, under the same paths."""
    start = time.perf_counter()
    out: dict[str, Any] = {}
    with requests.Session() as s:
        s.headers.update(server.headers)
        for view, files in (("zarr", zarr_files), ("precomputed", precomputed_files),
                            ("precomputed-sharded", sharded_files)):
            names = files(s, server.url)
            sizes = [copy_file(s, server.url, root, name) for name in names]
            out[view] = {"files": sum(1 for n in sizes if n), "absent": sum(1 for n in sizes if not n),
                         "bytes": sum(sizes)}
    out["seconds"] = time.perf_counter() - start
    return out


def chunk_paths(root: Path, view: str) -> list[str]:
    """The copy's chunk files of a view (its metadata left out), relative to the root."""
    base = root / view / CHANNEL
    return sorted(str(p.relative_to(root)) for p in base.rglob("*")
                  if p.is_file() and p.name not in ("zarr.json", "info"))


# --- the static server ------------------------------------------------------------------------


def static_config(root: Path, state: Path, port: int) -> str:
    user = "user root root;" if os.geteuid() == 0 else ""  # workers must read the copy
    temps = "\n".join(f"    {kind}_temp_path {state / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                             "uwsgi", "scgi"))
    cors = "\n".join(f'            add_header {k} "{v}" always;' for k, v in CORS.items())
    return f"""daemon off;
{user}
worker_processes 1;
pid {state / 'nginx.pid'};
error_log {state / 'error.log'} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
{temps}
    types {{ application/json json; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {root};
        location / {{
            if ($request_method = OPTIONS) {{ return 204; }}
{cors}
        }}
        location ~ /info$ {{
            default_type application/json;
{cors}
        }}
    }}
}}
"""


@contextmanager
def static_server(root: Path) -> Iterator[str]:
    """nginx serving ``root`` on a free 127.0.0.1 port (Range, ETag and keep-alive natively)."""
    with tempfile.TemporaryDirectory(prefix="ndbench-nginx-") as state_dir:
        state, port = Path(state_dir), free_port()
        conf = state / "nginx.conf"
        conf.write_text(static_config(root, state, port))
        args = [nginx_executable(), "-c", str(conf), "-p", str(state), "-e", str(state / "error.log")]
        proc = subprocess.Popen(args)
        with serving(proc, f"http://127.0.0.1:{port}/", lambda status: status < 500, "static nginx") as server:
            yield server.url.rstrip("/")


# --- readers ----------------------------------------------------------------------------------


def tensorstore_spec(kind: str, server: Server | Path) -> dict[str, Any]:
    if isinstance(server, Path):  # the copy's files, no HTTP
        return {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{server}/zarr/{CHANNEL}/0/"}}
    view = {"zarr3": f"zarr/{CHANNEL}/0/", "precomputed": f"precomputed/{CHANNEL}/",
            "sharded": f"precomputed-sharded/{CHANNEL}/"}[kind]
    kvstore = {"driver": "http", "base_url": f"{server.url}/{view}", "headers": server.header_lines()}
    return ({"driver": "zarr3", "kvstore": kvstore} if kind == "zarr3" else
            {"driver": "neuroglancer_precomputed", "scale_index": 0, "kvstore": kvstore})


def tensorstore_read(spec: dict[str, Any]) -> np.ndarray:
    """Open and read everything with a fresh context whose cache holds nothing: every chunk is
    fetched. Returned (z, y, x)."""
    store = ts.open(spec, read=True, context=ts.Context({"cache_pool": {"total_bytes_limit": 0}})).result()
    got = store.read().result()
    return got[0] if spec["driver"] == "zarr3" else got[..., 0].transpose(2, 1, 0)


@contextmanager
def cloudvolume_client(headers: dict[str, str], threads: int) -> Iterator[None]:
    """CloudVolume with ``headers`` on its HTTP GETs (cloudfiles' HTTP interface sends basic-auth
    credentials only) and ``threads`` download threads (a module constant of CloudVolume's)."""
    from cloudfiles.interfaces import HttpInterface
    from cloudvolume.datasource.precomputed.image import rx

    saved = HttpInterface.default_headers, rx.DEFAULT_THREADS
    HttpInterface.default_headers = lambda self: dict(headers)
    rx.DEFAULT_THREADS = threads
    try:
        yield
    finally:
        HttpInterface.default_headers, rx.DEFAULT_THREADS = saved


def cloudvolume_read(server: Server, threads: int) -> np.ndarray:
    from cloudvolume import CloudVolume

    with cloudvolume_client(server.headers, threads):
        vol = CloudVolume(f"precomputed://{server.url}/precomputed/{CHANNEL}", mip=0, cache=False, progress=False,
                          fill_missing=True, parallel=1)
        return np.asarray(vol[:, :, :])[..., 0].transpose(2, 1, 0)


def rate(read: Callable[[], object], nbytes: int) -> dict[str, float]:
    start = time.perf_counter()
    read()
    return {"MBps": nbytes / (time.perf_counter() - start) / 1e6}


def chunk_latency(server: Server, paths: list[str], n: int, seed: int) -> dict[str, float]:
    """``n`` GETs of random chunks, one after another on one kept-alive session; the same
    sequence on every server for a seed."""
    rng = random.Random(seed)
    with requests.Session() as s:
        s.headers.update(server.headers)
        for path in paths[:5]:  # the connection, before the clock
            read_body(s, f"{server.url}/{path}")
        return latencies(lambda: read_body(s, f"{server.url}/{rng.choice(paths)}"), n)


# --- Neuroglancer -----------------------------------------------------------------------------


def view_state(source: str) -> dict[str, Any]:
    """A 4-panel view of one image layer, dimensions as the landing page's links set them (the
    frame's voxels are 1 nm; zarr's t axis is not displayed)."""
    dims: dict[str, Any] = {axis: [1e-9, "m"] for axis in "xyz"}
    if source.startswith("zarr3://"):
        dims["t"] = [1, ""]
    return {"dimensions": dims, "displayDimensions": ["x", "y", "z"], "layout": "4panel",
            "layers": [{"type": "image", "source": source, "name": "c"}]}


def view_seconds(browser: Any, app: str, source: str) -> dict[str, float]:
    """In a fresh browser context (no cached chunk): load the Neuroglancer app, then time from
    restoring the view's state to the moment every panel is ready (each visible chunk in GPU
    memory; at least one chunk came), held for QUIET_S. Chunks it prefetches beyond the view
    may still be on their way then."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        page = context.new_page()
        page.goto(app)
        page.wait_for_function("() => window.viewer !== undefined", timeout=VIEW_TIMEOUT_S * 1000)
        chunks, errors, data = [0], [], source.split("://", 1)[1]
        context.on("response", lambda r: chunks.__setitem__(0, chunks[0] + (
            r.url.startswith(data) and r.status == 200 and not r.url.endswith(("zarr.json", "info")))))
        page.on("pageerror", lambda e: errors.append(str(e)))
        start = time.perf_counter()
        page.evaluate("state => window.viewer.state.restoreState(state)", view_state(source))
        ready_since, seen = None, 0
        while (now := time.perf_counter()) - start < VIEW_TIMEOUT_S:
            if chunks[0] and page.evaluate("() => window.viewer.display.isReady()"):
                ready_since, seen = ready_since or now, seen or chunks[0]
                if now - ready_since >= QUIET_S:
                    return {"s": ready_since - start, "chunks": seen}
            else:
                ready_since, seen = None, 0
            page.wait_for_timeout(20)
        raise RuntimeError(f"Neuroglancer did not finish drawing {source} in {VIEW_TIMEOUT_S} s ({chunks[0]} chunks "
                           f"came): {errors}")
    finally:
        context.close()


@contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# --- rounds -----------------------------------------------------------------------------------


Measure = Callable[[Any, int], dict[str, float]]  # (target, round) -> figures


def label(target: Server | Path) -> str:
    return target.name if isinstance(target, Server) else "file"


def run_rounds(measures: dict[str, tuple[Measure, list[Any]]], rounds: int) -> dict[str, Any]:
    """Each measure on each of its targets, every round, the targets' order reversed each other
    round (NDStore first, then static first, ...). Returns {measure: {target: {key: summary}}},
    with the per-round ratios NDStore / static ("ratio") and NDStore / file ("ratio_file")."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in measures}
    for i in range(rounds):
        for name, (measure, targets) in measures.items():
            for target in targets if i % 2 == 0 else targets[::-1]:
                runs[name].setdefault(label(target), []).append(measure(target, i))
        print(f"round {i + 1}/{rounds} done", flush=True)
    out: dict[str, Any] = {}
    for name, by in runs.items():
        out[name] = {who: {key: summary([r[key] for r in rs]) for key in rs[0]} for who, rs in by.items()}
        for base, key in (("static", "ratio"), ("file", "ratio_file")):
            if base in by:
                out[name][key] = {k: summary([n[k] / b[k] for n, b in zip(by["ndstore"], by[base])])
                                  for k in by[base][0]}
    return out


def check_same_voxels(servers: list[Server], copy: Path, voxels: np.ndarray) -> None:
    """Every reader gets the written volume from both servers (once, before the clock; it warms
    the connections too)."""
    for server in servers:
        for kind in ("zarr3", "precomputed", "sharded"):
            np.testing.assert_array_equal(tensorstore_read(tensorstore_spec(kind, server)), voxels, kind)
        np.testing.assert_array_equal(cloudvolume_read(server, 1), voxels, "cloudvolume")
    np.testing.assert_array_equal(tensorstore_read(tensorstore_spec("zarr3", copy)), voxels, "file")


CLOUDVOLUME_THREADS = (1, 20)  # one thread; CloudVolume's default


def reader_measures(servers: list[Server], copy: Path, nbytes: int, n: int) -> dict[str, tuple[Measure, list[Any]]]:
    def tensorstore(kind: str) -> Measure:
        return lambda target, _: rate(lambda: tensorstore_read(tensorstore_spec(kind, target)), nbytes)

    def cloudvolume(threads: int) -> Measure:
        return lambda target, _: rate(lambda: cloudvolume_read(target, threads), nbytes)

    def chunks(paths: list[str]) -> Measure:  # the round seeds the sequence: both servers GET the same chunks
        return lambda target, i: chunk_latency(target, paths, n, i)

    return {"tensorstore_zarr3": (tensorstore("zarr3"), [*servers, copy]),
            "tensorstore_precomputed": (tensorstore("precomputed"), servers),
            "tensorstore_sharded": (tensorstore("sharded"), servers),
            **{f"cloudvolume_{t}": (cloudvolume(t), servers) for t in CLOUDVOLUME_THREADS},
            **{f"chunk_{view}": (chunks(chunk_paths(copy, view)), servers) for view in ("zarr", "precomputed")}}


NG_VIEWS = {"zarr3": "zarr", "precomputed": "precomputed"}  # Neuroglancer's scheme: the view's URL prefix


def neuroglancer_measures(browser: Any, app: str, servers: list[Server]) -> dict[str, tuple[Measure, list[Any]]]:
    def view(scheme: str) -> Measure:
        return lambda target, _: view_seconds(browser, app, f"{scheme}://{target.url}/{NG_VIEWS[scheme]}/{CHANNEL}")

    return {f"neuroglancer_{scheme}": (view(scheme), servers) for scheme in NG_VIEWS}


def make_public(stack_url: str) -> None:
    r = requests.put(f"{stack_url}/v1/collection/bench/", json={"public": True},
                     headers={"Authorization": f"Token {ADMIN_TOKEN}"}, timeout=30)
    r.raise_for_status()


def neuroglancer_installed(stack_url: str) -> str | None:
    """Why the Neuroglancer part cannot run here, or None."""
    if CHROMIUM is None:
        return "Chromium is not installed (make browser)"
    if requests.get(f"{stack_url}/neuroglancer/", timeout=30).status_code != 200:
        return "the Neuroglancer build is not installed (deploy/neuroglancer/install.sh)"
    return None


# --- the table --------------------------------------------------------------------------------


HEADER = ["what", "NDStore", "static (nginx)", "ratio (1.0 = as fast as static; higher is better)", "goal",
          "verdict"]
UNITS = ("Throughputs are MB/s of level-0 voxels, times ms or s: median (min–max) of the rounds. Ratios are "
         "the median of the rounds' paired ratios: NDStore / static for throughputs, static / NDStore for "
         "times, so that 1.0 is as fast as the static copy served by nginx and higher is better.")
GOALS = {"tensorstore": 0.7, "cloudvolume": 0.9, "p50_ms": 1 / 1.5, "p99_ms": 1 / 2, "neuroglancer": 1 / 1.2}


def ratio_cell(ratio: dict[str, Any], key: str, invert: bool) -> tuple[str, float]:
    s = ratio[key]
    if invert:  # a time: static / NDStore; the min and max swap
        s = {"median": 1 / s["median"], "min": 1 / s["max"], "max": 1 / s["min"], "n": s["n"]}
    return fmt(s, 2), s["median"]


def verdict(value: float, goal: float) -> str:
    return "met" if value >= goal else f"short: {value / goal:.2f} of goal"


def table(record: dict[str, Any]) -> list[list[str]]:
    r, rows = record["readers"], []
    names = {"zarr3": "zarr3 over HTTP", "precomputed": "neuroglancer_precomputed", "sharded":
             "neuroglancer_precomputed sharded (ranged GETs)"}
    for kind, name in names.items():
        m = r[f"tensorstore_{kind}"]
        cell, value = ratio_cell(m["ratio"], "MBps", False)
        rows.append([f"TensorStore {name}, whole level 0, MB/s", fmt(m["ndstore"]["MBps"]), fmt(m["static"]["MBps"]),
                     cell, "≥ 0.7", verdict(value, GOALS["tensorstore"])])
    file = r["tensorstore_zarr3"]
    rows.append(["ceiling: TensorStore zarr3 reading the copy's files (`file` kvstore), MB/s", "",
                 fmt(file["file"]["MBps"]), f"NDStore / file: {fmt(file['ratio_file']['MBps'], 2)}", "", ""])
    for threads in CLOUDVOLUME_THREADS:
        m = r[f"cloudvolume_{threads}"]
        cell, value = ratio_cell(m["ratio"], "MBps", False)
        rows.append([f"CloudVolume precomputed://, {threads} thread{'s' if threads > 1 else ''}, MB/s",
                     fmt(m["ndstore"]["MBps"]), fmt(m["static"]["MBps"]), cell,
                     "≥ 0.9" if threads == 1 else "", verdict(value, GOALS["cloudvolume"]) if threads == 1 else ""])
    for view in ("zarr", "precomputed"):
        m = r[f"chunk_{view}"]
        for q, goal in (("p50_ms", "≤ 1.5x static (≥ 0.67)"), ("p99_ms", "≤ 2x static (≥ 0.5)")):
            cell, value = ratio_cell(m["ratio"], q, True)
            rows.append([f"one /{view}/ chunk, sequential GETs, {q[:3]} ms", fmt(m["ndstore"][q], 2),
                         fmt(m["static"][q], 2), cell, goal, verdict(value, GOALS[q])])
    for name, m in record.get("neuroglancer", {}).items():
        cell, value = ratio_cell(m["ratio"], "s", True)
        scheme, chunks = name.removeprefix("neuroglancer_"), m["ndstore"]["chunks"]["median"]
        rows.append([f"Neuroglancer 4-panel view of {scheme}:// drawn, s ({chunks:.0f} chunks)",
                     fmt(m["ndstore"]["s"], 2), fmt(m["static"]["s"], 2), cell, "≤ 1.2x static (≥ 0.83)",
                     verdict(value, GOALS["neuroglancer"])])
    return rows


def notes(record: dict[str, Any]) -> str:
    copy = record["copy"]
    files = "; ".join(f"/{view}/: {c['files']} files, {c['bytes'] / 2**20:.1f} MiB" for view, c in copy.items()
                      if isinstance(c, dict))
    ng = record.get("neuroglancer_note", "")
    return (f"Level 0 is {record['frame_xyz']} (x, y, z) uint8, written through the cache tier (hot). The static "
            f"copy was GET from NDStore in this run ({files}; {copy['seconds']:.1f} s) and served by nginx "
            f"(sendfile, keep-alive, 1 worker, as NDStore's front). NDStore: {record['workers']} web workers behind "
            "its nginx front, read with the admin token. TensorStore reads with a fresh context and no cache; "
            f"CloudVolume with parallel=1, cache off. {ng}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller volume, fewer GETs, 2 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, 2 with --quick)")
    args = parser.parse_args()
    frame, n = ((512, 512, 64), 100) if args.quick else ((1024, 1024, 64), 300)
    rounds = args.rounds or (2 if args.quick else 3)
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds, "frame_xyz": frame,
                              "workers": 2, "chunk_gets_per_round": n}
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}, workers=2,
                     with_merger=False) as stack, tempfile.TemporaryDirectory(prefix="ndbench-static-") as tmp:
        create_dataset(stack, frame)
        voxels = write_volume(stack.url, frame)
        ndstore = Server("ndstore", stack.url, {"Authorization": f"Token {ADMIN_TOKEN}"})
        copy = Path(tmp)
        record["copy"] = make_copy(ndstore, copy)
        with static_server(copy) as static_url:
            servers = [ndstore, Server("static", static_url, {})]
            check_same_voxels(servers, copy, voxels)
            record["readers"] = run_rounds(reader_measures(servers, copy, voxels.nbytes, n), rounds)
            missing = neuroglancer_installed(stack.url)
            if missing:
                record["neuroglancer_note"] = f"Neuroglancer was not run: {missing}."
            else:
                make_public(stack.url)
                record["neuroglancer_note"] = (
                    "Neuroglancer (served by NDStore at /neuroglancer/, headless Chromium, WebGL through "
                    "SwiftShader, 1200x800) reads NDStore anonymously: the collection was made public for that "
                    "part only; the static source is the nginx URL (CORS). Its time runs from restoring the "
                    "view's state in an app already loaded (a fresh browser context: no cached chunk) to every "
                    f"panel ready (each visible chunk in GPU memory), held for {QUIET_S} s; the chunk counts are those "
                    "received by then.")
                with chromium() as browser:
                    record["neuroglancer"] = run_rounds(
                        neuroglancer_measures(browser, f"{stack.url}/neuroglancer/", servers), rounds)
    print(write_results("views", record, table(record), HEADER, notes(record), UNITS))


if __name__ == "__main__":
    main()
