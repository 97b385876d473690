"""Memory of a web worker serving the largest allowed request (DESIGN §8: peak RSS <= 2 x the
response + a documented constant): the growth of a fresh worker's peak RSS (VmHWM) while it
serves one read of NDSTORE_MAX_CUTOUT_BYTES (paged in from the base tier, from a hot cache,
straight from the base tier; raw and blosc answers) and one write of that size, each divided by
the response (the box for a write). The constant: two read windows of blobs
(NDSTORE_READ_WINDOW_BYTES, docs/design/serving.md) + what glibc keeps of freed memory as
`ndstore up` tunes it (MALLOC_TRIM_THRESHOLD_ + MALLOC_TOP_PAD_: blobs freed by one of the I/O
threads stay in that thread's arena for its next fetch).

    python -m benchmarks.bench_memory [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import blosc
import numpy as np
import redis
import requests

from benchmarks.common import Stack, create_dataset, fmt, hardware, local_stack, summary, write_results
from ndstore.core.geometry import Box
from ndstore.engine.cost import cost
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.ops.localstack import MALLOC_TUNING, wait_until
from ndstore.storage.redis_cache import DIRTY

MiB = 1 << 20
WINDOW = 64 * MiB  # NDSTORE_READ_WINDOW_BYTES's default
RETAINED = int(MALLOC_TUNING["MALLOC_TRIM_THRESHOLD_"]) + int(MALLOC_TUNING["MALLOC_TOP_PAD_"])
BOX = (2048, 2048, 256)  # (x, y, z) uint8: the default NDSTORE_MAX_CUTOUT_BYTES, 1 GiB
SHIFTED = Box((8, 8, 8), BOX)  # not aligned: every supercuboid at the low edges is partly covered
THIN = Box((0, 0, 8), (BOX[0], BOX[1], 24))  # 64 MiB over 16 supercuboids, each partly covered
PLANE = Box((0, 0, 8), (BOX[0], BOX[1], 9))  # 4 MiB, one voxel deep over 16 supercuboids


def reserved(box: Box) -> int:
    """What the budget reserves for a write of ``box`` (ndstore/engine/cost.py)."""
    frame = Box((0, 0, 0), BOX)
    cutout = Cutout(ChannelVolume(1, 1, 1, np.dtype("uint8"), frame, 1, "anisotropic", 1), 0, box, range(1))
    return cost(False, cutout.nbytes, cutout, WINDOW)


def worker_pid(stack: Stack) -> int:
    children = subprocess.run(["pgrep", "-P", str(stack.gunicorn_pid)], capture_output=True, text=True).stdout.split()
    if len(children) != 1:
        raise RuntimeError(f"expected one gunicorn worker, found {children}")
    return int(children[0])


def status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def fresh_worker(stack: Stack, session: requests.Session, warm_up: str) -> int:
    """Replace gunicorn's worker (nothing of an earlier request's freed memory kept), let it serve
    a small read, and reset its peak RSS to what it holds now."""
    old = worker_pid(stack)
    os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while True:
        time.sleep(0.2)
        try:
            pid = worker_pid(stack)
        except RuntimeError:
            continue
        if pid != old and session.get(warm_up, headers={"Accept": "application/octet-stream"}, timeout=10).ok:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("gunicorn did not replace its worker")
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM := VmRSS
    return pid


def drain(response: requests.Response) -> int:
    """Read a streamed answer in 8 MiB pieces (the client holds none of it); its length."""
    response.raise_for_status()
    size = 0
    for piece in response.iter_content(8 * MiB):
        size += len(piece)
    return size


def peak_growth(stack: Stack, session: requests.Session, warm_up: str, before: Callable[[], None],
                call: Callable[[], int]) -> tuple[int, int]:
    """(growth of a fresh worker's peak RSS while ``call`` runs, the bytes ``call`` reports)."""
    before()
    pid = fresh_worker(stack, session, warm_up)
    start = status_bytes(pid, "VmRSS")
    size = call()
    return status_bytes(pid, "VmHWM") - start, size


def measure(rounds: int) -> dict[str, Any]:
    x, y, z = BOX
    largest = x * y * z
    env = {"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_MAX_CUTOUT_BYTES": str(largest),
           "NDSTORE_MAX_BODY_BYTES": str(largest), "NDSTORE_READ_WINDOW_BYTES": str(WINDOW)}
    record: dict[str, Any] = {"largest_bytes": largest, "window_bytes": WINDOW, "retained_bytes": RETAINED,
                              "requests": {}}
    with local_stack(env, workers=1, threads=4, with_merger=False) as stack:
        prefix = create_dataset(stack, (x, y, z))
        box = f"0:{x}/0:{y}/0:{z}/"
        s = stack.session()
        cache = redis.Redis.from_url(stack.redis_url)
        data = np.random.default_rng(7).integers(0, 256, (z, y, x), dtype=np.uint8).tobytes()  # does not compress
        raw = {"Accept": "application/octet-stream"}
        octet = {"Content-Type": "application/octet-stream"}

        def write(path: str) -> int:
            s.post(f"{stack.url}/v1/{path}/{prefix}/{box}", data=data, headers=octet, timeout=600).raise_for_status()
            return largest

        def write_part(path: str, part: Box) -> Callable[[], int]:
            """A write of ``part`` of the box: its partly covered supercuboids are read (paged in,
            or read from the base tier) first."""
            body = np.frombuffer(data, np.uint8).reshape(z, y, x)[part.slices_zyx()].tobytes()

            def call() -> int:
                s.post(f"{stack.url}/v1/{path}/{prefix}/{part}/", data=body, headers=octet,
                       timeout=600).raise_for_status()
                return len(body)
            return call

        # a blosc body of voxels that compress (3 bits each, bit-shuffled): the body, its decoded
        # array and the new cuboids are all held at once
        packed = blosc.compress(bytes(np.frombuffer(data, np.uint8) >> 5), typesize=1, cname="lz4", clevel=5,
                                shuffle=blosc.BITSHUFFLE)

        def write_packed() -> int:
            s.post(f"{stack.url}/v1/cutout/{prefix}/{box}", data=packed, headers={"Content-Type": "application/blosc"},
                   timeout=600).raise_for_status()
            return largest  # the box's voxels, as for every write: what the budget counts

        def empty_cache() -> None:
            """Once the flusher has written every dirty supercuboid back, drop the whole cache."""
            wait_until(lambda: cache.zcard(DIRTY) == 0, "the flusher to write the cache back", 120)
            cache.flushdb()

        def read(path: str, headers: dict[str, str], part: str = box) -> Callable[[], int]:
            return lambda: drain(s.get(f"{stack.url}/v1/{path}/{prefix}/{part}", headers=headers, stream=True,
                                       timeout=600))

        def nothing() -> None:
            pass

        write("direct/cutout")  # the base tier holds the box; the cache nothing dirty
        warm_up = f"{stack.url}/v1/direct/cutout/{prefix}/0:8/0:8/0:8/"
        cases: dict[str, tuple[Callable[[], None], Callable[[], int]]] = {
            "read, paged in from the base tier (raw)": (cache.flushdb, read("cutout", raw)),
            "read, hot cache (raw)": (nothing, read("cutout", raw)),  # the page-in above left it cached
            "read, hot cache (blosc)": (nothing, read("cutout", {"Accept": "application/blosc"})),
            "read, straight from the base tier (raw)": (nothing, read("direct/cutout", raw)),
            "read of a thin plane (4 MiB, 1 voxel deep over 16 supercuboids), paged in (raw)": (
                cache.flushdb, read("cutout", raw, f"{PLANE}/")),
            "read of a thin plane (4 MiB, 1 voxel deep over 16 supercuboids), straight from the base tier (raw)": (
                nothing, read("direct/cutout", raw, f"{PLANE}/")),
            "write through the cache tier, not aligned (raw body)": (empty_cache, write_part("cutout", SHIFTED)),
            "write straight to the base tier, not aligned (raw body)": (empty_cache,
                                                                        write_part("direct/cutout", SHIFTED)),
            "thin write (64 MiB over 16 partly covered supercuboids) through the cache tier": (
                empty_cache, write_part("cutout", THIN)),
            "thin write (64 MiB over 16 partly covered supercuboids) straight to the base tier": (
                empty_cache, write_part("direct/cutout", THIN)),
            "write through the cache tier (raw body)": (nothing, lambda: write("cutout")),
            "write through the cache tier (blosc body)": (nothing, write_packed),
        }
        for name, (before, call) in cases.items():
            grown, sizes = [], []
            for _ in range(rounds):
                g, size = peak_growth(stack, s, warm_up, before, call)
                grown.append(g / MiB)
                sizes.append(size)
            response = max(sizes)
            ratio = summary([g * MiB / response for g in grown])
            record["requests"][name] = {"grown_mib": summary(grown), "answer_bytes": response, "ratio": ratio}
            if not name.startswith("read"):
                part = THIN if name.startswith("thin") else SHIFTED if "not aligned" in name else Box((0, 0, 0), BOX)
                record["requests"][name]["reserved_bytes"] = reserved(part)
            print(f"{name}: peak RSS grew {fmt(summary(grown))} MiB for {response / MiB:.0f} MiB "
                  f"({fmt(ratio, 2)} x)", flush=True)
    return record


HEADER = ["request (the largest allowed, and a thin write)", "answer (a read) or box (a write), MiB",
          "worker peak RSS growth, MiB", "÷ the answer", "bound, MiB: a read 2 x answer + 2 x window, a write what "
          "the budget reserves; + glibc's 320", "verdict"]


def bound_mib(rec: dict[str, Any], r: dict[str, Any]) -> float:
    held = r.get("reserved_bytes", 2 * r["answer_bytes"] + 2 * rec["window_bytes"])
    return (held + rec["retained_bytes"]) / MiB


def table(rec: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, r in rec["requests"].items():
        bound = bound_mib(rec, r)
        rows.append([name, f"{r['answer_bytes'] / MiB:.0f}", fmt(r["grown_mib"]), fmt(r["ratio"], 2), f"{bound:.0f}",
                     "met" if r["grown_mib"]["max"] <= bound else "short"])
    return rows


NOTES = """
Each figure: a fresh web worker (gunicorn replaces the one before, so no memory an earlier
request freed is reused), one small read to warm it, its peak RSS (VmHWM) reset, then one request
of the largest allowed size (NDSTORE_MAX_CUTOUT_BYTES of uint8 random voxels, which do not
compress), read by the client in 8 MiB pieces. A read holds its array and its encoded answer,
plus at most two read windows of fetched blobs (NDSTORE_READ_WINDOW_BYTES); before the window
(stop 31), every fetched blob was held until the whole box was decoded: 3-3.5 x the answer. A
write holds the body, its decoded array and the new cuboids, and a window of the supercuboids it
touches (a partly covered one read whole, its stored object and its new one); its bound is what
the budget reserves for it (4 x its box + 3 x a window of the supercuboids it touches:
docs/design/serving.md, "Budgets") and its ratio is to its box's raw bytes (the blosc body is
~40% of them; the writes that are not aligned start 8 voxels in on every axis, so the
supercuboids at the low edges are read first; the thin write is 16 voxels deep, 8 in). The
paged-in read and the unaligned and thin writes start from an empty cache (after the flusher
wrote it back). The bound's constant: what glibc keeps of freed memory (MALLOC_TRIM_THRESHOLD_ +
MALLOC_TOP_PAD_ as `ndstore up` sets them, 320 MiB): the I/O threads fetch blobs in turn and
each keeps the memory of its last one in its own arena.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 3")
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    record = {"hardware": hardware(), "quick": args.quick, "rounds": rounds, **measure(rounds)}
    print(write_results("memory", record, table(record), HEADER, NOTES, units="Peak RSS growth of one web worker."))


if __name__ == "__main__":
    main()
