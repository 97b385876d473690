"""A bounded mixed workload on the whole local stack for a fixed time: error rate, p50/p99 per
kind of request, and every acknowledged write checked afterwards (the reliability bar: zero
errors, zero lost writes).

    python -m benchmarks.bench_load [--quick] [--seconds N]

Clients, all at once, on one dataset (uint8 image channel 1024x1024x64, uint64 annotation channel):
- 2 viewers: 512x512 xy PNG tiles and 64^3 cutouts at random places (reads of hot and cold data);
- 1 pipeline: 16 MiB boxes written through the cache tier, each read back and compared at once;
- 2 annotators: 64x64x8 writes through the cache tier, each into cells of its own;
- 1 NDBlaze annotator: 64x64x8 uint64 label writes into the NDBlaze buffer, cells of its own.
Every write's value is remembered per cell; after the run an NDBlaze merge is requested and every
cell is read back and compared with the last acknowledged value written to it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import blosc
import numpy as np
import requests

from benchmarks.common import create_dataset, hardware, local_stack, read_body, write_results
from ndstore.core.synthetic import em_like

FRAME = (1024, 1024, 64)  # x, y, z
CELL = (64, 64, 8)
PIPE_BOX = (512, 512, 64)  # 16 MiB of uint8, at x 0:512, y 0:512
HEADER = ["client", "requests", "errors", "p50 ms", "p99 ms", "checked cells / boxes", "lost or wrong"]


class Recorder:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.errors: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def call(self, kind: str, send: Callable[..., requests.Response], url: str, **kw: Any) -> requests.Response | None:
        start = time.perf_counter()
        try:
            r = send(url, **kw)
            ok = r.status_code in (200, 201)
            problem = "" if ok else f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as exc:
            r, problem = None, f"{type(exc).__name__}: {exc}"
        elapsed = (time.perf_counter() - start) * 1000
        with self.lock:
            self.times.setdefault(kind, []).append(elapsed)
            if problem:
                self.errors.setdefault(kind, []).append(problem)
        return r if not problem else None


def _cells(x_range: tuple[int, int], y_range: tuple[int, int]) -> list[tuple[int, int, int]]:
    return [(x, y, z) for x in range(*x_range, CELL[0]) for y in range(*y_range, CELL[1])
            for z in range(0, FRAME[2], CELL[2])]


def _box(path: str, x: int, y: int, z: int, size: tuple[int, int, int] = CELL) -> str:
    return f"{path}/{x}:{x + size[0]}/{y}:{y + size[1]}/{z}:{z + size[2]}/"


def run(seconds: float) -> dict[str, Any]:
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}) as stack:
        image = f"{stack.url}/v1/cutout/{create_dataset(stack, FRAME)}"
        with stack.session() as s:
            r = s.post(f"{stack.url}/v1/collection/bench/experiment/e/channel/ann/",
                       json={"type": "annotation", "datatype": "uint64"})
            r.raise_for_status()
        labels_blaze = f"{stack.url}/v1/blaze/cutout/bench/e/ann/0"
        labels = f"{stack.url}/v1/cutout/bench/e/ann/0"
        rec = Recorder()
        stop = time.monotonic() + seconds
        last: dict[str, dict[tuple[int, int, int], int]] = {"annotator0": {}, "annotator1": {}, "blaze": {}}
        pipeline_checks = {"boxes": 0, "wrong": 0}

        def viewer(i: int) -> None:
            rng, s = random.Random(i), stack.session()
            while time.monotonic() < stop:
                if rng.random() < 0.5:
                    z, x, y = rng.randrange(FRAME[2]), rng.randrange(0, 512, 64), rng.randrange(0, 512, 64)
                    rec.call("viewer 512x512 xy tile", s.get,
                             f"{stack.url}/v1/image/bench/e/c/xy/0/{x}:{x + 512}/{y}:{y + 512}/{z}/")
                else:
                    x, y = rng.randrange(FRAME[0] - 64), rng.randrange(FRAME[1] - 64)
                    rec.call("viewer 64^3 cutout", s.get, _box(image, x, y, rng.randrange(FRAME[2] - 63), (64, 64, 64)),
                             headers={"Accept": "application/blosc"})

        def pipeline() -> None:
            s, seed = stack.session(), 0
            while time.monotonic() < stop:
                volume = em_like(PIPE_BOX[::-1], seed=seed)
                url = _box(image, 0, 0, 0, PIPE_BOX)
                body = blosc.compress(volume, typesize=1, cname="lz4", clevel=1)
                if rec.call("pipeline 16 MiB write", s.post, url, data=body,
                            headers={"Content-Type": "application/blosc"}):
                    started = time.perf_counter()
                    try:
                        got = np.frombuffer(blosc.decompress(read_body(s, url, {"Accept": "application/blosc"})),
                                            np.uint8)
                        same = bool(np.array_equal(got.reshape(volume.shape), volume))
                    except Exception as exc:  # noqa: BLE001 - counted as an error of this kind
                        same = False
                        rec.errors.setdefault("pipeline 16 MiB read-back", []).append(repr(exc))
                    rec.times.setdefault("pipeline 16 MiB read-back", []).append((time.perf_counter() - started) * 1000)
                    pipeline_checks["boxes"] += 1
                    pipeline_checks["wrong"] += 0 if same else 1
                seed += 1

        def annotator(i: int) -> None:
            rng, s = random.Random(100 + i), stack.session()
            cells = _cells((i * 512, (i + 1) * 512), (512, 1024))
            n = 0
            while time.monotonic() < stop:
                cell = rng.choice(cells)
                n += 1
                value = n % 255 + 1
                body = np.full(CELL[::-1], value, np.uint8).tobytes()
                if rec.call("annotator 64x64x8 write (cache tier)", s.post, _box(image, *cell), data=body,
                            headers={"Content-Type": "application/octet-stream"}):
                    last[f"annotator{i}"][cell] = value

        def blaze_annotator() -> None:
            rng, s = random.Random(7), stack.session()
            cells = _cells((0, 1024), (0, 256))
            n = 0
            while time.monotonic() < stop:
                cell = rng.choice(cells)
                n += 1
                body = np.full(CELL[::-1], n, np.uint64).tobytes()
                if rec.call("annotator 64x64x8 uint64 write (NDBlaze)", s.post, _box(labels_blaze, *cell), data=body,
                            headers={"Content-Type": "application/octet-stream"}):
                    last["blaze"][cell] = n

        threads = [threading.Thread(target=viewer, args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=pipeline)]
        threads += [threading.Thread(target=annotator, args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=blaze_annotator)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ran_s = time.monotonic() - started

        with stack.session() as s:
            status_path = s.post(f"{stack.url}/v1/blaze/merge/").json()["status"]
            deadline = time.monotonic() + 600
            while s.get(f"{stack.url}{status_path}").json()["state"] not in ("done", "failed"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the NDBlaze merge did not finish in 10 minutes")
                time.sleep(0.5)
            lost = {name: _check(s, labels if name == "blaze" else image, cells, np.uint64 if name == "blaze"
                                 else np.uint8) for name, cells in last.items()}
    return {"seconds": ran_s, "times": rec.times, "errors": rec.errors, "pipeline": pipeline_checks,
            "cells": {name: len(cells) for name, cells in last.items()}, "lost": lost}


def _check(s: requests.Session, path: str, cells: dict[tuple[int, int, int], int], dtype: Any) -> int:
    """Cells whose stored value is not the last one acknowledged."""
    wrong = 0
    for cell, value in cells.items():
        got = np.frombuffer(read_body(s, _box(path, *cell), {"Accept": "application/octet-stream"}), dtype)
        wrong += int(got.size != CELL[0] * CELL[1] * CELL[2] or not (got == value).all())
    return wrong


def table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    checks = {"annotator 64x64x8 write (cache tier)": ("annotator0", "annotator1"),
              "annotator 64x64x8 uint64 write (NDBlaze)": ("blaze",)}
    for kind, times in sorted(record["times"].items()):
        ordered = sorted(times)
        checked, lost = "", ""
        if kind in checks:
            checked = str(sum(record["cells"][c] for c in checks[kind]))
            lost = str(sum(record["lost"][c] for c in checks[kind]))
        elif kind == "pipeline 16 MiB read-back":
            checked, lost = str(record["pipeline"]["boxes"]), str(record["pipeline"]["wrong"])
        rows.append([kind, str(len(times)), str(len(record["errors"].get(kind, []))),
                     f"{statistics.median(ordered):.1f}", f"{ordered[int(0.99 * (len(ordered) - 1))]:.1f}",
                     checked, lost])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 s instead of 120 s")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    seconds = args.seconds or (30.0 if args.quick else 120.0)
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, **run(seconds)}
    record["total_requests"] = sum(len(t) for t in record["times"].values())
    record["total_errors"] = sum(len(e) for e in record["errors"].values())
    record["total_lost"] = sum(record["lost"].values()) + record["pipeline"]["wrong"]
    record["load_minutes"] = record["seconds"] / 60
    extra = (f"\n{record['load_minutes']:.1f} load-minutes, {record['total_requests']} requests: "
             f"{record['total_errors']} errors, {record['total_lost']} lost or wrong writes.\n")
    for kind, problems in record["errors"].items():
        extra += f"\n- {kind}: {len(problems)} errors, first: `{problems[0]}`"
    print(write_results("load", record, table(record), HEADER, extra,
                        units="Latencies of every request of the run, per kind of client."))


if __name__ == "__main__":
    main()
