"""The cache tier through the HTTP service (the paper's Fig. 7 and 8 at this machine's scale):
hot-cache read, cold-cache read and cache write of aligned 16 MiB regions vs client threads,
the latency of a hot 512x512x16 cutout, small writes and label writes, beside the ceilings of
the same run (Redis HMGET and HSET of a supercuboid's 64 cuboids, loopback HTTP, blosc, and
DESIGN §8's prototype of the hot path -- plain WSGI + Redis + blosc -- reading and writing the
same regions: benchmarks/prototype.py).

    python -m benchmarks.bench_cache [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blosc
import numpy as np
import requests

from benchmarks.bench_direct import blosc_rates, loopback_rates
from benchmarks.common import (
    SMALL,
    Stack,
    concurrent_rate,
    cpu_seconds,
    create_dataset,
    cuboid_cache,
    evict_all,
    fmt,
    hardware,
    latencies,
    local_stack,
    loopback_http,
    plain_wsgi_server,
    read_body,
    repeated_posts,
    small_write_body,
    small_write_url,
    summary,
    write_results,
)
from benchmarks.prototype import memory_redis, prototype_server
from benchmarks.prototype import store as prototype_store
from benchmarks.prototype import store_object as prototype_store_object
from benchmarks.supercuboids import GRID, REGION_BYTES, SC
from ndstore.core.chunks import compress_cuboid, cuboid_boxes
from ndstore.core.synthetic import em_like
from ndstore.storage import redis_client


def region(stack: Stack, prefix: str, i: int, path: str = "cutout") -> str:
    x0 = i * SC[0]
    return f"{stack.url}/v1/{path}/{prefix}/{x0}:{x0 + SC[0]}/0:{SC[1]}/0:{SC[2]}/"


# Requests per client thread in one round of hot reads and of writes: one 16 MiB request per
# thread made a round 50-100 ms long, and its rate swung with whichever request was slowest.
REPS = 4


def cache_rates(stack: Stack, prefix: str, bodies: list[bytes], threads: int, rounds: int) -> dict[str, Any]:
    """Cold reads first: each thread reads REPS regions of its own that the base tier holds and
    the cache does not (evicted before each round, as the cache manager evicts: the Redis keeps
    its checked mark, so a round measures page-ins, not the loss check of a Redis found empty)."""
    sessions = [stack.session() for _ in range(threads)]
    cache = cuboid_cache(stack.redis_url)

    def post(i: int, path: str, at: int | None = None) -> int:
        sessions[i].post(region(stack, prefix, i if at is None else at, path), data=bodies[i],
                         headers={"Content-Type": "application/blosc"}).raise_for_status()
        return REGION_BYTES

    def read(i: int, at: int | None = None) -> int:
        url = region(stack, prefix, i if at is None else at)
        blosc.decompress(read_body(sessions[i], url, {"Accept": "application/blosc"}))
        return REGION_BYTES

    for i in range(threads):
        for r in range(REPS):  # the base tier holds every region; the cache holds nothing dirty
            post(i, "direct/cutout", at=r * threads + i)

    def cold_round() -> float:
        evict_all(cache)
        turns = [iter(range(i, threads * REPS, threads)) for i in range(threads)]
        return concurrent_rate(lambda i: read(i, at=next(turns[i])), threads, REPS)

    cold = [cold_round() for _ in range(rounds)]
    read(0)
    hot = [concurrent_rate(read, threads, REPS) for _ in range(rounds)]
    write = [concurrent_rate(lambda i: post(i, "cutout"), threads, REPS) for _ in range(rounds)]
    return {"cold_read": summary(cold), "hot_read": summary(hot), "write": summary(write)}


def prototype_rates(stack: Stack, memory_redis_url: str, volumes: list[np.ndarray], bodies: list[bytes],
                    threads: int, rounds: int) -> dict[str, Any]:
    """DESIGN §8's prototype (benchmarks/prototype.py) reading and writing the same regions as
    the service, with the same client: into the stack's own Redis (the same appendfsync), and
    once more into a Redis that keeps nothing on disk (what the goals' prototype figures, 800
    MB/s of writes and 540 of cold reads, cannot have paid)."""

    def rates(redis_url: str, objects: Path, hot: bool) -> dict[str, Any]:
        client = redis_client.connect(redis_url)
        for i in range(threads):
            prototype_store(client, i, volumes[i])
        try:
            with prototype_server(redis_url, objects) as proto:
                sessions = [requests.Session() for _ in range(threads)]

                def read(i: int, query: str = "") -> int:
                    blosc.decompress(read_body(sessions[i], f"{proto.url}/{i}{query}", {"Accept": "application/blosc"}))
                    return REGION_BYTES

                def post(i: int) -> int:
                    sessions[i].post(f"{proto.url}/{i}", data=bodies[i],
                                     headers={"Content-Type": "application/blosc"}).raise_for_status()
                    return REGION_BYTES

                out = {"write": summary([concurrent_rate(post, threads, REPS) for _ in range(rounds)]),
                       "cold_read": summary([concurrent_rate(lambda i: read(i, "?cold"), threads, REPS)
                                             for _ in range(rounds)])}
                if hot:
                    out["hot_read"] = summary([concurrent_rate(read, threads, REPS) for _ in range(rounds)])
                return out
        finally:
            client.delete(*(f"proto:{i}" for i in range(threads)))

    with tempfile.TemporaryDirectory(prefix="ndbench-objects-") as tmp:
        objects = Path(tmp)
        for i in range(threads):
            prototype_store_object(objects, i, volumes[i])
        same = rates(stack.redis_url, objects, hot=True)
        memory = rates(memory_redis_url, objects, hot=False)
    return {**same, "write_no_aof": memory["write"], "cold_read_no_aof": memory["cold_read"]}


def redis_ceilings(url: str, volume: np.ndarray, rounds: int, thread_counts: list[int]) -> dict[str, Any]:
    """Storing and fetching one supercuboid's 64 compressed cuboids with nothing else around it
    (the cache adapter's own HSET batches and HMGET), in raw-voxel MB/s; and storing them from as
    many clients at once as the cache writes have (each its own supercuboid: Redis's AOF may
    fsync several clients' writes at once)."""
    cache = cuboid_cache(url)
    boxes = cuboid_boxes(GRID.cuboid, GRID.cuboids_per_super)
    blobs = {n: compress_cuboid(volume[b.slices_zyx()]) for n, b in enumerate(boxes)}

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return REGION_BYTES / (time.perf_counter() - start) / 1e6

    hset = [timed(lambda: cache.put("ceiling", blobs, 0.0, dirty=False)) for _ in range(rounds)]
    hmget = [timed(lambda: cache.get_many({"ceiling": list(blobs)})) for _ in range(rounds)]

    def put(i: int) -> int:
        cache.put(f"ceiling{i}", blobs, 0.0, dirty=False)
        return REGION_BYTES

    # one client's is `hset`; from several clients at once, each its own supercuboid
    hset_clients = {t: summary([concurrent_rate(put, t, reps=4) for _ in range(rounds)]) for t in thread_counts
                    if t > 1}
    for i in range(max(thread_counts)):
        cache.evict(f"ceiling{i}")
    cache.evict("ceiling")
    return {"hset": summary(hset), "hmget": summary(hmget), "hset_clients": hset_clients}


def hot_latency(stack: Stack, prefix: str, n: int) -> dict[str, float]:
    s = stack.session()
    url = f"{stack.url}/v1/cutout/{prefix}/0:512/0:512/0:16/"
    read_body(s, url, {"Accept": "application/blosc"})
    return latencies(lambda: blosc.decompress(read_body(s, url, {"Accept": "application/blosc"})), n)


def small_writes(stack: Stack, prefix: str, threads: int, rounds: int, per_thread: int) -> dict[str, Any]:
    """Writes/s of 64x64x8 uint8 boxes at random positions through the cache tier (each thread its
    own sequence of positions inside the dataset), beside bare loopback POSTs of the same body."""
    import random

    sessions = [stack.session() for _ in range(threads)]
    body = small_write_body(5)
    x_max, y_max, z_max = SC[0] * threads - SMALL[0], SC[1] - SMALL[1], SC[2] - SMALL[2]

    def write(i: int) -> int:
        rng = random.Random(i)
        for _ in range(per_thread):
            x, y, z = rng.randrange(x_max), rng.randrange(y_max), rng.randrange(z_max)
            url = small_write_url(f"{stack.url}/v1/cutout/{prefix}", x, y, z)
            sessions[i].post(url, data=body, headers={"Content-Type": "application/blosc"}).raise_for_status()
        return per_thread

    with loopback_http(body) as bare:
        bare_post = repeated_posts(sessions, bare, body, per_thread)
        loop = [concurrent_rate(bare_post, threads) * 1e6 for _ in range(rounds)]
    return {"writes_per_s": summary([concurrent_rate(write, threads) * 1e6 for _ in range(rounds)]),
            "loopback_posts_per_s": summary(loop)}


# An annotation channel's writes: sparse uint64 labels (cuboids of 128x128x2: a few KiB each once
# compressed), a tool's stroke and a pipeline's or a proofreader's region of 32 whole cuboids.
LABEL_WRITES = {"stroke_64x64x8": (64, 64, 8), "region_512x512x4": (512, 512, 4)}


def label_writes(stack: Stack, rounds: int, n: int) -> dict[str, Any]:
    """One client writing labels into a uint64 annotation channel over resident supercuboids:
    writes/s and the whole service's CPU per write, for a 64x64x8 stroke at random positions and
    a 512x512x4 region aligned to the cuboids (docs/design/serving.md, "Which requests go without
    locks")."""
    import random

    s, rng = stack.session(), random.Random(11)
    r = s.post(f"{stack.url}/v1/collection/bench/experiment/e/channel/labels/",
               json={"type": "annotation", "datatype": "uint64"})
    if r.status_code != 201:
        raise RuntimeError(f"creating the label channel answered {r.status_code}: {r.text}")
    url = f"{stack.url}/v1/cutout/bench/e/labels/0"
    span = (2 * SC[0], SC[1], 8)  # two supercuboids of uint64 (512x512x8 each), made resident first
    base = np.ones(span[::-1], np.uint64)
    s.post(f"{url}/0:{span[0]}/0:{span[1]}/0:{span[2]}/", data=blosc.compress(base, typesize=8),
           headers={"Content-Type": "application/blosc"}).raise_for_status()
    out: dict[str, Any] = {}
    for name, (x_len, y_len, z_len) in LABEL_WRITES.items():
        labels = np.zeros((z_len, y_len, x_len), np.uint64)
        labels[:, y_len // 4:y_len // 2, x_len // 8:x_len // 2] = 10**12 + 7
        body = blosc.compress(labels, typesize=8, cname="lz4", clevel=5)
        step = 1 if name.startswith("stroke") else 128  # a region starts on a cuboid's corner

        def write(body: bytes = body, x_len: int = x_len, y_len: int = y_len, z_len: int = z_len,
                  step: int = step) -> None:
            x = rng.randrange(0, span[0] - x_len + 1, step)
            y = rng.randrange(0, span[1] - y_len + 1, step)
            z = rng.randrange(0, span[2] - z_len + 1, 2 if step > 1 else 1)
            s.post(f"{url}/{x}:{x + x_len}/{y}:{y + y_len}/{z}:{z + z_len}/", data=body,
                   headers={"Content-Type": "application/blosc"}).raise_for_status()

        write()
        rates, cpu = [], []
        for _ in range(rounds):
            before, start = cpu_seconds(stack.pids), time.perf_counter()
            for _ in range(n):
                write()
            rates.append(n / (time.perf_counter() - start))
            cpu.append((cpu_seconds(stack.pids) - before) / n * 1e3)
        out[name] = {"writes_per_s": summary(rates), "service_ms": summary(cpu)}
    return out


def tiny_requests(stack: Stack, prefix: str, rounds: int, n: int, ceiling: bool = True) -> dict[str, Any]:
    """Server CPU per tiny request (DESIGN §8: a 64x64x8 write, a 1-voxel read), one client
    thread so that no request waits on another: the whole service (web workers, Redis, nginx,
    the daemons that write back) and the web workers alone, in ms per request; beside the same
    requests' CPU on a plain WSGI app under gunicorn (the ceiling)."""
    import random

    s, rng = stack.session(), random.Random(7)
    body = small_write_body(6)
    x_max, y_max, z_max = SC[0] - SMALL[0], SC[1] - SMALL[1], SC[2] - SMALL[2]

    def small_write() -> None:
        x, y, z = rng.randrange(x_max), rng.randrange(y_max), rng.randrange(z_max)
        s.post(small_write_url(f"{stack.url}/v1/cutout/{prefix}", x, y, z), data=body,
               headers={"Content-Type": "application/blosc"}).raise_for_status()

    def voxel_read() -> None:
        x, y, z = rng.randrange(SC[0]), rng.randrange(SC[1]), rng.randrange(SC[2])
        read_body(s, f"{stack.url}/v1/cutout/{prefix}/{x}:{x + 1}/{y}:{y + 1}/{z}:{z + 1}/",
                  {"Accept": "application/octet-stream"})

    def per_request(fn: Callable[[], None], roots: list[int]) -> float:
        before = cpu_seconds(roots)
        for _ in range(n):
            fn()
        return (cpu_seconds(roots) - before) / n * 1e3

    out: dict[str, Any] = {}
    for name, fn in (("write_64x64x8", small_write), ("read_1_voxel", voxel_read)):
        fn()  # the touched supercuboids are resident from here on
        service, web = [], []
        for _ in range(rounds):
            service.append(per_request(fn, stack.pids))
            web.append(per_request(fn, [stack.gunicorn_pid]))
        out[name] = {"service_ms": summary(service), "web_ms": summary(web)}
    if not ceiling:
        return out
    with plain_wsgi_server() as plain:
        bare = requests.Session()
        plain_post = [per_request(lambda: bare.post(plain.url, data=body).raise_for_status(), [plain.pid])
                      for _ in range(rounds)]
        plain_get = [per_request(lambda: read_body(bare, plain.url), [plain.pid]) for _ in range(rounds)]
    out["plain_wsgi_ms"] = {"write_64x64x8": summary(plain_post), "read_1_voxel": summary(plain_get)}
    return out


def through_the_framework(rounds: int, n: int) -> dict[str, Any]:
    """The tiny requests again with the data routes sent through Django's whole URLconf and
    middleware and DRF's dispatch (NDSTORE_LEAN_DATA_ROUTES=0, ndstore/api/data_routes.py): what
    the framework would cost them."""
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_LEAN_DATA_ROUTES": "0"},
                     with_merger=False) as stack:
        return tiny_requests(stack, create_dataset(stack, SC), rounds, n, ceiling=False)


HEADER = ["what", "client threads", "MB/s median (min–max)", "ratio to ceiling"]


def _ratio(value: dict[str, float], ceiling: float, name: str) -> str:
    return f"{value['median'] / ceiling:.2f} of {name}"


def _versus(proto: dict[str, Any] | None, rates: dict[str, Any], kind: str) -> str:
    """"; <ratio> of the prototype" for one figure, when the run measured the prototype."""
    return f"; {_ratio(rates[kind], proto[kind]['median'], 'the prototype')}" if proto else ""


def table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    redis_c, b, lat = record["redis"], record["blosc"], record["latency"]
    for threads, r in record["cache"].items():
        loop = record["loopback"][threads]["get"]["median"]
        proto = record.get("prototype", {}).get(threads)
        rows.append(["hot-cache read", str(threads), fmt(r["hot_read"]),
                     _ratio(r["hot_read"], loop, "loopback GET") + _versus(proto, r, "hot_read")])
        rows.append(["cold-cache read", str(threads), fmt(r["cold_read"]),
                     _ratio(r["cold_read"], loop, "loopback GET") + _versus(proto, r, "cold_read")])
        hset, clients = redis_c.get("hset_clients", {}).get(threads), f"Redis HSET, {threads} clients"
        if hset is None:  # a run from before the ceiling was measured with the writes' clients
            hset, clients = redis_c["hset"], "Redis HSET"
        rows.append(["cache write", str(threads), fmt(r["write"]),
                     _ratio(r["write"], hset["median"], clients) + _versus(proto, r, "write")])
    for threads, p in record.get("prototype", {}).items():
        rows.append(["ceiling: DESIGN §8 prototype (plain WSGI + Redis + blosc, no front), hot read / cold read / "
                     "write, into the stack's Redis (appendfsync always)", str(threads),
                     f"{fmt(p['hot_read'])} / {fmt(p['cold_read'])} / {fmt(p['write'])}", ""])
        rows.append(["ceiling: the same prototype into a Redis without AOF, cold read / write", str(threads),
                     f"{fmt(p['cold_read_no_aof'])} / {fmt(p['write_no_aof'])}", ""])
    for threads, r in record["loopback"].items():
        rows.append(["ceiling: loopback HTTP 16 MiB GET / POST", str(threads), f"{fmt(r['get'])} / {fmt(r['post'])}",
                     ""])
    rows.append(["ceiling: Redis HMGET / HSET of 64 cuboids", "1",
                 f"{fmt(redis_c['hmget'])} / {fmt(redis_c['hset'])}", ""])
    for threads, c in redis_c.get("hset_clients", {}).items():
        rows.append(["ceiling: Redis HSET of 64 cuboids, each client its own supercuboid", str(threads), fmt(c), ""])
    rows.append(["ceiling: blosc lz4 compress / decompress", "1", f"{fmt(b['compress'])} / {fmt(b['decompress'])}", ""])
    rows.append(["hot 512x512x16 cutout latency", "1", f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms", ""])
    for threads, r in record.get("small_writes", {}).items():
        rows.append(["small random 64x64x8 writes, writes/s (goal ≥ 400)", str(threads), fmt(r["writes_per_s"]),
                     f"{r['writes_per_s']['median'] / r['loopback_posts_per_s']['median']:.2f} of loopback POSTs/s "
                     f"({r['loopback_posts_per_s']['median']:.0f})"])
    for name, r in record.get("label_writes", {}).items():
        rows.append([f"label writes (uint64 annotation channel), {name.replace('_', ' ')}: writes/s, service "
                     "CPU ms/write", "1", f"{fmt(r['writes_per_s'])}, {fmt(r['service_ms'], 2)} ms", ""])
    for name, what in (("write_64x64x8", "64x64x8 write"), ("read_1_voxel", "1-voxel read")):
        if name in record.get("tiny", {}):
            r, plain = record["tiny"][name], record["tiny"]["plain_wsgi_ms"][name]["median"]
            rows.append([f"tiny request, {what}: server CPU ms/request, service / web workers (goal ≤ 2)", "1",
                         f"{fmt(r['service_ms'], 2)} / {fmt(r['web_ms'], 2)}",
                         f"{r['web_ms']['median'] / plain:.0f}x plain WSGI under gunicorn ({plain:.2f} ms)"])
        if name in record.get("tiny_through_drf", {}):
            r = record["tiny_through_drf"][name]
            rows.append([f"the same {what} through Django's URLconf and middleware and DRF's dispatch "
                         "(NDSTORE_LEAN_DATA_ROUTES=0): server CPU ms/request, service / web workers", "1",
                         f"{fmt(r['service_ms'], 2)} / {fmt(r['web_ms'], 2)}", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and thread counts (< 3 minutes)")
    args = parser.parse_args()
    rounds, thread_counts = (3, [1, 2]) if args.quick else (5, [1, 2, 4, 8, 16])
    volumes = [em_like((SC[2], SC[1], SC[0]), seed=i) for i in range(max(thread_counts))]
    bodies = [blosc.compress(v, typesize=1, cname="lz4", clevel=5) for v in volumes]
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds,
                              "blosc": blosc_rates(volumes[0], rounds), "cache": {},
                              "loopback": {t: loopback_rates(volumes[0].tobytes(), t, rounds) for t in thread_counts}}
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}) as stack, \
            memory_redis() as memory_redis_url:
        prefix = create_dataset(stack, (SC[0] * max(thread_counts) * REPS, SC[1], SC[2]))
        record["redis"] = redis_ceilings(stack.redis_url, volumes[0], rounds, thread_counts)
        for threads in thread_counts:
            record["cache"][threads] = cache_rates(stack, prefix, bodies, threads, rounds)
            r = record["cache"][threads]
            record.setdefault("prototype", {})[threads] = p = prototype_rates(stack, memory_redis_url, volumes, bodies,
                                                                              threads, rounds)
            print(f"x{threads}: hot {fmt(r['hot_read'])}, cold {fmt(r['cold_read'])}, write {fmt(r['write'])}; "
                  f"prototype hot {fmt(p['hot_read'])}, cold {fmt(p['cold_read'])} ({fmt(p['cold_read_no_aof'])} "
                  f"without AOF), write {fmt(p['write'])} ({fmt(p['write_no_aof'])} without AOF)", flush=True)
        record["latency"] = hot_latency(stack, prefix, 50 if args.quick else 200)
        record["tiny"] = tiny_requests(stack, prefix, rounds, 100 if args.quick else 300)
        record["small_writes"] = {t: small_writes(stack, prefix, t, rounds, 100 if args.quick else 300)
                                  for t in thread_counts[:3]}
        record["label_writes"] = label_writes(stack, rounds, 100 if args.quick else 300)
    record["tiny_through_drf"] = through_the_framework(rounds, 100 if args.quick else 300)
    print(write_results("cache_tier", record, table(record), HEADER))


if __name__ == "__main__":
    main()
