"""Where the time goes in the figures that fall short of DESIGN.md §8: py-spy samples every
process of the stack (gunicorn's workers, Redis is C and shows as the time the workers wait on
it) while one workload runs for a fixed time, and the hottest functions by own time and by
inclusive time are written to results/profile_<workload>.md (+ the collapsed stacks, for a
flame graph with any speedscope/flamegraph tool). Over the same requests every process's CPU is
read from /proc: the web workers, the front, each Redis, the daemons, an object store of its own,
the client and the profiler, per request, beside the cores' whole time per request (the rest
idle); in the .md and in results/profile_<workload>.json, which summary.py reads.

    python -m benchmarks.profile_shortfalls [--seconds 20] [--gil] [--backend file|moto]
        [hot_read cold_read direct_read direct_write cache_write blaze_write small_writes
         blaze_small_writes tiny_read tile]

Each workload is the request of one short figure of results/summary.md, as its benchmark sends
it: cold_read evicts every cached supercuboid before each round of reads, as bench_cache does
(the cache manager's way: the Redis keeps its checked mark), blaze_write posts 16 MiB bodies to NDBlaze
and empties its buffer now and then the way a merge would, without applying it.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import blosc
import redis

from benchmarks.bench_blaze import BLAZE_SETTINGS, discard_pending
from benchmarks.bench_direct import open_backend
from benchmarks.common import (
    RESULTS,
    SMALL,
    CpuByPart,
    Stack,
    create_dataset,
    cuboid_cache,
    evict_all,
    hardware,
    local_stack,
    read_body,
    small_write_body,
    small_write_url,
    stack_parts,
)
from benchmarks.supercuboids import GRID, SC
from ndstore.core.synthetic import em_like

CUBOID = GRID.cuboid  # (128, 128, 16) voxels, x y z: a level-0 zarr chunk
THREADS = 2


def workloads(stack: Stack, prefix: str, bodies: list[bytes]) -> dict[str, Any]:
    sessions = [stack.session() for _ in range(THREADS)]

    def region(i: int) -> str:
        x0 = i * SC[0]
        return f"{stack.url}/v1/cutout/{prefix}/{x0}:{x0 + SC[0]}/0:{SC[1]}/0:{SC[2]}/"

    def hot_read(i: int) -> None:
        read_body(sessions[i], region(i), {"Accept": "application/blosc"})

    cache = cuboid_cache(stack.redis_url)  # nothing is dirty when cold_read runs (see main)
    round_start = threading.Barrier(THREADS, action=lambda: evict_all(cache), timeout=10)

    def cold_read(i: int) -> None:
        try:
            round_start.wait()  # the last thread to arrive evicts everything; then all read
        except threading.BrokenBarrierError:
            return  # the other thread ran out of time and left
        hot_read(i)

    def direct_read(i: int) -> None:
        read_body(sessions[i], region(i).replace("/v1/cutout/", "/v1/direct/cutout/"), {"Accept": "application/blosc"})

    def post(i: int, url: str) -> None:
        sessions[i].post(url, data=bodies[i], headers={"Content-Type": "application/blosc"}).raise_for_status()

    def cache_write(i: int) -> None:
        post(i, region(i))

    def direct_write(i: int) -> None:
        post(i, region(i).replace("/v1/cutout/", "/v1/direct/cutout/"))

    blaze = redis.Redis.from_url(stack.blaze_redis_url)
    posted = [0] * THREADS

    def blaze_write(i: int) -> None:
        posted[i] += 1
        if i == 0 and posted[i] % 8 == 0:
            discard_pending(blaze)  # pending writes are capped (4 GiB by default); a merge would empty it
        post(i, region(i).replace("/v1/cutout/", "/v1/blaze/cutout/"))

    small = small_write_body(5)
    rng = random.Random(1)

    def small_writes(i: int, path: str = "cutout") -> None:
        x, y, z = (rng.randrange(span - small) for span, small in zip((SC[0] * THREADS, SC[1], SC[2]), SMALL))
        sessions[i].post(small_write_url(f"{stack.url}/v1/{path}/{prefix}", x, y, z), data=small,
                         headers={"Content-Type": "application/blosc"}).raise_for_status()

    def blaze_small_writes(i: int) -> None:
        small_writes(i, "blaze/cutout")

    def tiny_read(i: int) -> None:
        x, y, z = rng.randrange(SC[0] * THREADS), rng.randrange(SC[1]), rng.randrange(SC[2])
        read_body(sessions[i], f"{stack.url}/v1/cutout/{prefix}/{x}:{x + 1}/{y}:{y + 1}/{z}:{z + 1}/",
                  {"Accept": "application/octet-stream"})

    channel = prefix.rsplit("/", 1)[0]  # the prefix ends in the resolution

    def tile(i: int) -> None:
        x0, z = i * SC[0], rng.randrange(SC[2])
        read_body(sessions[i], f"{stack.url}/v1/image/{channel}/xy/0/{x0}:{x0 + 512}/0:512/{z}/",
                  {"Accept": "image/png"})

    def chunk(i: int) -> None:  # one zarr chunk (a cuboid) of the level-0 array, as a viewer reads it
        x, y, z = (rng.randrange(span // c) for span, c in zip((SC[0] * THREADS, SC[1], SC[2]), CUBOID))
        read_body(sessions[i], f"{stack.url}/zarr/{channel}/0/c/0/{z}/{y}/{x}")

    return {"hot_read": hot_read, "chunk": chunk, "cold_read": cold_read, "tile": tile, "direct_read": direct_read,
            "direct_write": direct_write, "cache_write": cache_write, "blaze_write": blaze_write,
            "small_writes": small_writes, "blaze_small_writes": blaze_small_writes, "tiny_read": tiny_read}


PROFILER = "profiler (py-spy)"
# bytes of voxels each workload's request carries (what a rate goal in MB/s counts)
REQUEST_BYTES = {**dict.fromkeys(["hot_read", "cold_read", "direct_read", "direct_write", "cache_write",
                                  "blaze_write"], SC[0] * SC[1] * SC[2]),
                 **dict.fromkeys(["small_writes", "blaze_small_writes"], SMALL[0] * SMALL[1] * SMALL[2]),
                 "tiny_read": 1, "tile": 512 * 512, "chunk": CUBOID[0] * CUBOID[1] * CUBOID[2]}


def per_request_machine(used: dict[str, float], wall_s: float, cores: int, requests: int,
                        request_bytes: int) -> dict[str, Any]:
    """What each request cost the machine: CPU ms per request by part, and the cores' time per
    request (cores x wall / requests), of which the rest was idle."""
    per = {part: seconds / requests * 1e3 for part, seconds in sorted(used.items(), key=lambda kv: -kv[1])}
    machine_ms = cores * wall_s / requests * 1e3
    return {"requests": requests, "seconds": wall_s, "cores": cores, "request_bytes": request_bytes,
            "cpu_ms_per_request": per, "machine_ms_per_request": machine_ms,
            "idle_ms_per_request": max(0.0, machine_ms - sum(per.values()))}


def machine_table(machine: dict[str, Any]) -> list[str]:
    per, whole = machine["cpu_ms_per_request"], machine["machine_ms_per_request"]
    return ["Every process's CPU (from /proc) over the same requests, per request: where the machine's "
            f"{machine['cores']} cores went (the profiler's own share included, as it ran).", "",
            "| part | CPU ms per request | share of the cores |", "|---|---|---|",
            *[f"| {part} | {ms:.2f} | {ms / whole:.0%} |" for part, ms in per.items()],
            f"| idle | {machine['idle_ms_per_request']:.2f} | {machine['idle_ms_per_request'] / whole:.0%} |",
            f"| all ({machine['cores']} cores x wall time / requests) | {whole:.2f} | 100% |"]


def run_for(fn: Any, seconds: float) -> int:
    stop = time.monotonic() + seconds
    counts = [0] * THREADS

    def worker(i: int) -> None:
        while time.monotonic() < stop:
            fn(i)
            counts[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts)


def top(collapsed: Path, n: int = 25) -> tuple[list[tuple[str, float]], list[tuple[str, float]], int]:
    """Own and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
                  for f in stack.split(";")[1:]]  # drop the process/thread name
        if not frames:
            continue
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    return ([(f, c / total) for f, c in own.most_common(n)], [(f, c / total) for f, c in inclusive.most_common(n)],
            total)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("names", nargs="*", default=["hot_read", "cache_write", "small_writes"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--backend", choices=["file", "moto"], default="file",
                        help="the base tier: the file store, or S3 + DynamoDB on moto's server")
    parser.add_argument("--gil", action="store_true",
                        help="count only samples of a thread holding the GIL (Python CPU time, not waits)")
    args = parser.parse_args()
    volumes = [em_like((SC[2], SC[1], SC[0]), seed=i) for i in range(THREADS)]
    bodies = [blosc.compress(v, typesize=1, cname="lz4", clevel=5) for v in volumes]
    blaze_on_demand = {k: v for k, v in BLAZE_SETTINGS.items() if k.startswith("NDSTORE_BLAZE_")}  # as bench_blaze
    with tempfile.TemporaryDirectory() as scratch, open_backend(args.backend, Path(scratch)) as backend, \
            local_stack({**backend.env, **blaze_on_demand}, with_merger=False) as stack:
        prefix = create_dataset(stack, (SC[0] * THREADS, SC[1], SC[2]))
        work = workloads(stack, prefix, bodies)
        run_for(work["cache_write"], 2)  # every region stored and hot
        for i in range(THREADS):
            work["direct_write"](i)  # ... and in the base tier, none dirty in the cache
        gunicorn = stack.gunicorn_pid
        parts = stack_parts(stack, backend.store_pids)
        # cold_read evicts without writing back, so it goes first: nothing is dirty yet
        for name in sorted(args.names, key=lambda n: n != "cold_read"):
            collapsed = RESULTS / f"profile_{name}.txt"
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(gunicorn),
                                    "--subprocesses", "--format", "raw", "--rate", "200", "--nonblocking",
                                    "--output", str(collapsed), "--duration", str(int(args.seconds)),
                                    *(["--gil"] if args.gil else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            cpu = CpuByPart({**parts, PROFILER: [spy.pid]})
            cpu.start()
            began = time.monotonic()
            done = run_for(work[name], args.seconds - 2)
            wall = time.monotonic() - began
            used = cpu.stop()
            spy.wait(60)
            own, inclusive, total = top(collapsed)
            hw = hardware()
            machine = per_request_machine(used, wall, hw["cores"], done, REQUEST_BYTES[name])
            (RESULTS / f"profile_{name}.json").write_text(json.dumps(machine, indent=1) + "\n")
            lines = [f"# profile: {name} (base tier: {args.backend})", "",
                     f"{hw['date'][:10]}, {hw['cores']} cores, {hw['cpu']}: "
                     f"{THREADS} client threads for {args.seconds - 2:.0f} s: {done} requests "
                     f"({done / (args.seconds - 2):.1f}/s); py-spy at 200 Hz over gunicorn's workers, {total} "
                     + ("samples of threads holding the GIL (Python CPU time)." if args.gil else
                        "samples (idle threads included: read shares relative to each other)."), "",
                     "| own time | function |", "|---|---|",
                     *[f"| {share:.1%} | `{f}` |" for f, share in own],
                     "", "| inclusive | function |", "|---|---|",
                     *[f"| {share:.1%} | `{f}` |" for f, share in inclusive],
                     "", *machine_table(machine)]
            (RESULTS / f"profile_{name}.md").write_text("\n".join(lines) + "\n")
            print("\n".join(lines[:20]), flush=True)


if __name__ == "__main__":
    main()
