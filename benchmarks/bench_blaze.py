"""NDBlaze through the HTTP service (the paper's Fig. 10 at this machine's scale): burst write
acceptance vs blob size (64 KiB to 512 MiB) and client threads, beside the cache-tier write rate
of 16 MiB regions and the ceilings measured in the same run (Redis SET of the same bodies,
loopback HTTP POST); small random 64x64x8 writes from 8 and 32 concurrent writers, NDBlaze
beside the cache tier at the same durability (issue 21's goal: >= 5x); then the merge job's
throughput per core.

    python -m benchmarks.bench_blaze [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable
from typing import Any

import blosc
import numpy as np
import redis

from benchmarks.common import (
    SMALL,
    Stack,
    concurrent_rate,
    create_dataset,
    fmt,
    hardware,
    local_stack,
    loopback_http,
    loopback_rates,
    repeated_posts,
    small_write_body,
    small_write_url,
    summary,
    write_results,
)
from ndstore.core.synthetic import em_like
from ndstore.ops.localstack import wait_until
from ndstore.storage.blaze_buffer import RedisBlazeBuffer

MiB = 1 << 20
# Blob boxes (x, y, z) of uint8 voxels, by raw size.
BOXES = {"64 KiB": (64, 64, 16), "1 MiB": (256, 256, 16), "16 MiB": (512, 512, 64),
         "128 MiB": (1024, 1024, 128), "512 MiB": (2048, 2048, 128)}
FRAME = (2048, 2048, 128)
TILE = em_like((64, 512, 512), seed=3)  # tiled to any box, with noise so no tile repeats exactly
BLAZE_SETTINGS = {
    "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite",
    "NDSTORE_BLAZE_MAX_PENDING_BYTES": str(8 << 30),
    "NDSTORE_BLAZE_MERGE_INTERVAL_S": "86400", "NDSTORE_BLAZE_MERGE_BACKLOG_BYTES": str(1 << 50),  # on demand only
    "NDSTORE_MAX_BODY_BYTES": str(1 << 30),
}


def volume(box: tuple[int, int, int]) -> np.ndarray:
    """EM-like voxels of any size, cheap to make. The noise keeps blosc from finding one tile
    in the next (bare tiling compressed 512 MiB boxes to a quarter), so every size compresses
    about alike (lz4 keeps ~0.9 of the bytes)."""
    x, y, z = box
    reps = (-(-z // TILE.shape[0]), -(-y // TILE.shape[1]), -(-x // TILE.shape[2]))
    tiled = np.tile(TILE, reps)[:z, :y, :x]
    return np.ascontiguousarray(tiled + np.random.default_rng(z * y * x).integers(0, 4, tiled.shape, np.uint8))


def body_of(box: tuple[int, int, int]) -> bytes:
    return blosc.compress(volume(box), typesize=1, cname="lz4", clevel=5)  # type: ignore[no-any-return]


def cutout_url(stack: Stack, path: str, box: tuple[int, int, int], x0: int = 0) -> str:
    x, y, z = box
    return f"{stack.url}/v1/{path}/bench/e/c/0/{x0}:{x0 + x}/0:{y}/0:{z}/"


def acceptance(stack: Stack, box: tuple[int, int, int], body: bytes, threads: int, rounds: int) -> dict[str, Any]:
    """Raw-voxel MB/s of POSTs to /v1/blaze/cutout/ that returned 201; the buffer is emptied
    between rounds (released as a merge releases what it applied, but unapplied), so every round
    starts from an empty buffer."""
    raw = int(np.prod(box))
    reps = max(1, min(400, (256 * MiB) // raw // threads))
    sessions = [stack.session() for _ in range(threads)]
    url = cutout_url(stack, "blaze/cutout", box)
    buffer = redis.Redis.from_url(stack.blaze_redis_url)

    def post(i: int) -> int:
        sessions[i].post(url, data=body, headers={"Content-Type": "application/blosc"}).raise_for_status()
        return raw

    rates = []
    for _ in range(rounds):
        discard_pending(buffer)
        rates.append(concurrent_rate(post, threads, reps))
    discard_pending(buffer)
    return {**summary(rates), "reps_per_thread": reps}


def discard_pending(client: redis.Redis) -> None:
    """Empty the buffer the way the merger does once it has applied a write (release), without
    applying it. Not FLUSHDB: the buffer's Redis carries its loss-detection marks, and a Redis
    found empty reads as one that lost acknowledged writes (503 DataLost)."""
    buffer = RedisBlazeBuffer(client, 1 << 62)
    for name in buffer.pending_names():
        buffer.release(name, buffer.pending_seqs([name])[name])


def redis_set_rate(url: str, body: bytes, raw: int, rounds: int, threads: int = 1) -> dict[str, float]:
    """``threads`` clients at once SETting the very body into the buffer's Redis (AOF on, as
    deployed), each its own keys."""
    from ndstore.storage import redis_client

    client = redis_client.connect(url, timeout_s=300)
    reps = max(1, min(400, (256 * MiB) // raw) // threads)

    def sets(t: int) -> int:
        for i in range(reps):
            client.set(f"ceiling:{t}:{i}", body)
        return raw * reps

    rates = []
    for _ in range(rounds):
        rates.append(concurrent_rate(sets, threads))
        client.delete(*(f"ceiling:{t}:{i}" for t in range(threads) for i in range(reps)))
    return summary(rates)


def small_write_rates(stack: Stack, threads: int, rounds: int, per_thread: int) -> dict[str, Any]:
    """Writes/s of 64x64x8 uint8 boxes at random positions of the frame from ``threads`` writers,
    to NDBlaze and through the cache tier (the same positions and bodies for both)."""
    sessions = [stack.session() for _ in range(threads)]
    body = small_write_body(5)
    buffer = redis.Redis.from_url(stack.blaze_redis_url)

    def writes(path: str) -> Callable[[int], int]:
        def write(i: int) -> int:
            rng = random.Random(i)
            for _ in range(per_thread):
                x, y, z = (rng.randrange(FRAME[d] - SMALL[d]) for d in range(3))
                sessions[i].post(small_write_url(f"{stack.url}/v1/{path}/bench/e/c/0", x, y, z), data=body,
                                 headers={"Content-Type": "application/blosc"}).raise_for_status()
            return per_thread
        return write

    out: dict[str, Any] = {"cache": [], "blaze": [], "loopback": []}
    with loopback_http(body) as bare:
        bare_post = repeated_posts(sessions, bare, body, per_thread)
        for _ in range(rounds):  # in turns, so the host's drift falls on all three
            out["cache"].append(concurrent_rate(writes("cutout"), threads) * 1e6)
            discard_pending(buffer)
            out["blaze"].append(concurrent_rate(writes("blaze/cutout"), threads) * 1e6)
            out["loopback"].append(concurrent_rate(bare_post, threads) * 1e6)
    discard_pending(buffer)
    return {"cache_writes_per_s": summary(out["cache"]), "blaze_writes_per_s": summary(out["blaze"]),
            "loopback_posts_per_s": summary(out["loopback"]), "per_thread": per_thread}


def cache_write_rate(stack: Stack, threads: int, rounds: int) -> dict[str, float]:
    """Aligned 16 MiB blosc writes through the cache tier, one region per thread."""
    box = BOXES["16 MiB"]
    body = body_of(box)
    sessions = [stack.session() for _ in range(threads)]

    def post(i: int) -> int:
        sessions[i].post(cutout_url(stack, "cutout", box, i * box[0]), data=body,
                         headers={"Content-Type": "application/blosc"}).raise_for_status()
        return int(np.prod(box))

    concurrent_rate(post, threads)  # page the regions in
    return summary([concurrent_rate(post, threads) for _ in range(rounds)])


def merge_rate(stack: Stack, writes: int) -> dict[str, Any]:
    """``writes`` random 64x64x16 annotation-like writes over the frame, then one on-demand
    merge by `ndstore up`'s merger (Spark, local[*]); MB/s of supercuboids rewritten."""
    s = stack.session()
    rng = np.random.default_rng(4)
    for _ in range(writes):
        x, y, z = (int(rng.integers(0, FRAME[i] - (64, 64, 16)[i])) for i in range(3))
        data = np.full((16, 64, 64), int(rng.integers(1, 255)), np.uint8)
        s.post(f"{stack.url}/v1/blaze/cutout/bench/e/c/0/{x}:{x + 64}/{y}:{y + 64}/{z}:{z + 16}/",
               data=blosc.compress(data, typesize=1), headers={"Content-Type": "application/blosc"}
               ).raise_for_status()
    status_path = s.post(f"{stack.url}/v1/blaze/merge/").json()["status"]
    wait_until(lambda: s.get(f"{stack.url}{status_path}").json()["state"] in ("done", "failed"), "merge", 600)
    status = s.get(f"{stack.url}{status_path}").json()
    if status["state"] != "done":
        raise RuntimeError(f"merge failed: {status}")
    wall = status["finished_at"] - status["started_at"]
    cores = os.cpu_count() or 1
    return {"writes": writes, "supercuboids": status["supercuboids"], "blobs": status["blobs_applied"],
            "wall_s": wall, "mb_s": status["voxel_bytes"] / wall / 1e6,
            "mb_s_per_core": status["voxel_bytes"] / wall / 1e6 / cores, "cores": cores}


HEADER = ["buffer Redis", "blob size", "client threads", "NDBlaze accepted MB/s", "÷ cache write (same threads)",
          "÷ Redis SET of the body (as many clients)"]
DEFAULT_MODE = "AOF, appendfsync always (default)"
MODES = {DEFAULT_MODE: {}, "in memory (no AOF)": {"NDSTORE_BLAZE_REDIS_APPENDONLY": "no"}}


def table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for mode, m in record["modes"].items():
        for size, by_threads in m["blaze"].items():
            for threads, r in by_threads.items():
                cache = m["cache_write"][threads]
                redis_set = m.get("redis_set_clients", {}).get(size, {}).get(threads, m["redis_set"][size])
                rows.append([mode, size, str(threads), fmt(r), f"{r['median'] / cache['median']:.1f}x",
                             f"{r['median'] / redis_set['median']:.2f}"])
        for threads, c in m["cache_write"].items():
            rows.append([mode, "cache-tier write, 16 MiB regions", str(threads), fmt(c), "", ""])
        for size, c in m["redis_set"].items():
            rows.append([mode, f"ceiling: Redis SET of the {size} body", "1", fmt(c), "", ""])
            for threads, cc in m.get("redis_set_clients", {}).get(size, {}).items():
                rows.append([mode, f"ceiling: Redis SET of the {size} body, each client its own keys", str(threads),
                             fmt(cc), "", ""])
    for threads, c in record["loopback"].items():
        rows.append(["", "ceiling: loopback HTTP POST, 16 MiB", str(threads), fmt(c["post"]), "", ""])
    m = record["merge"]
    merged = f"merge: {m['writes']} 64x64x16 writes into {m['supercuboids']} supercuboids"
    rate = f"{m['mb_s']:.0f} ({m['mb_s_per_core']:.0f} per core)"
    rows.append([DEFAULT_MODE, merged, f"{m['cores']} cores", rate, "", ""])
    for threads, r in record.get("small_writes", {}).items():
        blaze, cache = r["blaze_writes_per_s"], r["cache_writes_per_s"]
        loop = r.get("loopback_posts_per_s")
        bare = f"; loopback POSTs of the same body: {fmt(loop)}" if loop else ""
        rows.append([DEFAULT_MODE, f"small 64x64x8 writes, writes/s (cache tier: {fmt(cache)}{bare})",
                     f"{threads} writers", fmt(blaze), f"{blaze['median'] / cache['median']:.1f}x (goal ≥ 5x)", ""])
    return rows


NOTES = """
Each client thread POSTs the same application/blosc body (EM-like uint8, lz4) to
/v1/blaze/cutout/ as fast as the service answers 201; figures are raw-voxel MB/s. The buffer is
emptied between rounds by releasing its writes unapplied (as a merge releases applied ones; a
FLUSHDB would read as a lost Redis), so no merge runs during acceptance. The buffer's Redis runs
as `ndstore up` runs it (AOF on, appendfsync always, no eviction) and, for comparison, with
NDSTORE_BLAZE_REDIS_APPENDONLY=no (pending writes live in memory only: a Redis crash loses them).
The cache-write column divides by the cache-tier write rate of aligned 16 MiB regions with the
same number of client threads, in the same stack (DESIGN.md goal: >= 5x). The merge row: random
64x64x16 writes, merged on demand by the merger daemon (Spark local[*]); MB/s of whole
supercuboids read, patched and written back (a merge rewrites every touched 16 MiB supercuboid).
The small-writes rows: 8 and 32 writers (16 too in the full run), each POSTing 64x64x8 uint8
boxes (application/blosc) at its own random positions, first through the cache tier, then to
NDBlaze, in turns each round; both Redis servers fsync every write (`appendfsync always`), so
both rates are at the same durability. Issue 21's goal: NDBlaze >= 5x the cache tier. Each round
also POSTs the same body as often to a bare HTTP server on loopback with as many writers: no
service on this machine answers more writes than that.
"""


def measure_mode(env: dict[str, str], sizes: list[str], thread_counts: list[int], rounds: int,
                 merge_writes: int | None, small_writers: dict[int, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"cache_write": {}, "redis_set": {}, "blaze": {}}
    with local_stack({**BLAZE_SETTINGS, **env}) as stack:
        create_dataset(stack, FRAME)
        for threads in thread_counts:
            out["cache_write"][threads] = cache_write_rate(stack, threads, rounds)
            print(f"cache write x{threads}: {fmt(out['cache_write'][threads])}", flush=True)
        for size in sizes:
            body = body_of(BOXES[size])
            out["redis_set"][size] = redis_set_rate(stack.blaze_redis_url, body, int(np.prod(BOXES[size])), rounds)
            out.setdefault("redis_set_clients", {})[size] = {
                t: redis_set_rate(stack.blaze_redis_url, body, int(np.prod(BOXES[size])), rounds, t)
                for t in thread_counts if t > 1}
            out["blaze"][size] = {}
            for threads in thread_counts:
                out["blaze"][size][threads] = acceptance(stack, BOXES[size], body, threads, rounds)
                print(f"{size} x{threads}: {fmt(out['blaze'][size][threads])} "
                      f"(Redis SET {fmt(out['redis_set'][size])})", flush=True)
        for writers, per_thread in small_writers.items():
            out.setdefault("small_writes", {})[writers] = r = small_write_rates(stack, writers, rounds, per_thread)
            print(f"small writes x{writers}: NDBlaze {fmt(r['blaze_writes_per_s'])}/s, "
                  f"cache tier {fmt(r['cache_writes_per_s'])}/s", flush=True)
        if merge_writes:
            out["merge"] = merge_rate(stack, merge_writes)
            print(f"merge: {out['merge']}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, rounds and thread counts")
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    sizes = ["64 KiB", "1 MiB", "16 MiB"] if args.quick else list(BOXES)
    thread_counts = [1, 2] if args.quick else [1, 2, 4]
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds, "modes": {}}
    record["loopback"] = {t: loopback_rates(body_of(BOXES["16 MiB"]), t, rounds) for t in thread_counts}
    for i, (mode, env) in enumerate(MODES.items()):
        merge_writes = None if i else (200 if args.quick else 1000)
        small_writers = {} if i else ({8: 15, 32: 6} if args.quick else {8: 40, 16: 25, 32: 15})
        record["modes"][mode] = measure_mode(env, sizes, thread_counts, rounds, merge_writes, small_writers)
    record["merge"] = record["modes"][DEFAULT_MODE].pop("merge")
    record["small_writes"] = record["modes"][DEFAULT_MODE].pop("small_writes")
    print(write_results("blaze", record, table(record), HEADER, NOTES))


if __name__ == "__main__":
    main()
