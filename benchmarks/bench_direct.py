"""Direct I/O of aligned 16 MiB regions through the HTTP service, against the base tier's own
rate measured in the same run (DESIGN.md §8: direct read/write >= 80% of the object store's rate).

Each client thread reads or writes its own aligned supercuboid (512x512x64 uint8, EM-like data)
at /v1/direct/cutout/ with application/blosc bodies. Backends: the local file store (fsync on)
and S3 + DynamoDB on moto's server. Ceilings of the same run: the object store's PUT/GET of the
very objects the service stores, loopback HTTP of a 16 MiB body, blosc on the same data.

    python -m benchmarks.bench_direct [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import blosc
import numpy as np
import requests

from benchmarks.common import (
    Stack,
    concurrent_rate,
    create_dataset,
    fmt,
    hardware,
    local_stack,
    loopback_http,
    read_body,
    summary,
    write_results,
)
from ndstore.core.chunks import encode_supercuboid
from ndstore.core.geometry import grid_for_level
from ndstore.core.synthetic import em_like
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.interfaces import ObjectStore
from ndstore.storage.s3 import S3ObjectStore

GRID = grid_for_level("anisotropic", 0, 1)
SC = GRID.supercuboid  # (512, 512, 64)
REGION_BYTES = SC[0] * SC[1] * SC[2]


def region_url(stack: Stack, prefix: str, i: int) -> str:
    x0 = i * SC[0]
    return f"{stack.url}/v1/direct/cutout/{prefix}/{x0}:{x0 + SC[0]}/0:{SC[1]}/0:{SC[2]}/"


def service_rates(stack: Stack, prefix: str, bodies: list[bytes], threads: int, rounds: int) -> dict[str, Any]:
    sessions = [stack.session() for _ in range(threads)]

    def write(i: int) -> int:
        r = sessions[i].post(region_url(stack, prefix, i), data=bodies[i],
                             headers={"Content-Type": "application/blosc"})
        r.raise_for_status()
        return REGION_BYTES

    def read(i: int) -> int:
        body = read_body(sessions[i], region_url(stack, prefix, i), {"Accept": "application/blosc"})
        blosc.decompress(body)  # what a client (intern) does with it
        return REGION_BYTES

    write(0), read(0)  # warm the connections and the workers
    return {"write": summary([concurrent_rate(write, threads) for _ in range(rounds)]),
            "read": summary([concurrent_rate(read, threads) for _ in range(rounds)])}


def store_rates(store: ObjectStore, objects: list[bytes], threads: int, rounds: int) -> dict[str, Any]:
    """The store's own PUT/GET of the objects the service writes, in region-equivalent MB/s."""
    keys = [f"ceiling-{i}" for i in range(threads)]

    def put(i: int) -> int:
        store.put_many({keys[i]: objects[i]})
        return REGION_BYTES

    def get(i: int) -> int:
        next(iter(store.get_many([keys[i]])))
        return REGION_BYTES

    put(0)
    return {"put": summary([concurrent_rate(put, threads) for _ in range(rounds)]),
            "get": summary([concurrent_rate(get, threads) for _ in range(rounds)])}


def loopback_rates(body: bytes, threads: int, rounds: int) -> dict[str, Any]:
    with loopback_http(body) as url:
        sessions = [requests.Session() for _ in range(threads)]

        def get(i: int) -> int:
            return len(read_body(sessions[i], url))

        def post(i: int) -> int:
            sessions[i].post(url, data=body).raise_for_status()
            return len(body)

        return {"get": summary([concurrent_rate(get, threads) for _ in range(rounds)]),
                "post": summary([concurrent_rate(post, threads) for _ in range(rounds)])}


def blosc_rates(volume: np.ndarray, rounds: int) -> dict[str, Any]:
    def timed(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        return volume.nbytes / (time.perf_counter() - start) / 1e6

    packed = blosc.compress(volume, typesize=1, cname="lz4", clevel=5)
    return {"compress": summary([timed(lambda: blosc.compress(volume, typesize=1, cname="lz4", clevel=5))
                                 for _ in range(rounds)]),
            "decompress": summary([timed(lambda: blosc.decompress(packed)) for _ in range(rounds)]),
            "ratio": len(packed) / volume.nbytes}


def backends(names: list[str]) -> Iterator[tuple[str, dict[str, str], Callable[[str], ObjectStore]]]:
    """Yield (name, stack environment, make_store(data_dir)) for each base-tier backend."""
    if "file" in names:
        yield "file", {"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}, \
            lambda d: FileObjectStore(os.path.join(d, "ceiling"), fsync=True)
    if "moto" in names:
        from moto.server import ThreadedMotoServer

        from ndstore.client.localstack import free_port

        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(creds)
        try:
            env = {"NDSTORE_OBJECT_STORE": "s3", "NDSTORE_S3_ENDPOINT_URL": endpoint, "NDSTORE_INDEX": "dynamodb",
                   "NDSTORE_DYNAMODB_ENDPOINT_URL": endpoint, **creds}
            yield "moto", env, lambda d: S3ObjectStore("ceiling-bucket", endpoint)
        finally:
            server.stop()


def measure_backend(name: str, env: dict[str, str], store: ObjectStore, bodies: list[bytes],
                    objects: list[bytes], thread_counts: list[int], rounds: int) -> dict[int, Any]:
    out: dict[int, Any] = {}
    store.ensure_ready()
    with local_stack(env) as stack:
        prefix = create_dataset(stack, (SC[0] * max(thread_counts), SC[1], SC[2]))
        for threads in thread_counts:
            out[threads] = {"service": service_rates(stack, prefix, bodies, threads, rounds),
                            "store": store_rates(store, objects, threads, rounds)}
            svc, st = out[threads]["service"], out[threads]["store"]
            out[threads]["write_ratio"] = svc["write"]["median"] / st["put"]["median"]
            out[threads]["read_ratio"] = svc["read"]["median"] / st["get"]["median"]
            print(f"{name} x{threads}: write {fmt(svc['write'])} vs PUT {fmt(st['put'])}; "
                  f"read {fmt(svc['read'])} vs GET {fmt(st['get'])}", flush=True)
    return out


def table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, by_threads in record["backends"].items():
        for threads, r in by_threads.items():
            svc, st = r["service"], r["store"]
            rows.append([name, str(threads), fmt(svc["write"]), fmt(st["put"]), f"{r['write_ratio']:.2f}",
                         fmt(svc["read"]), fmt(st["get"]), f"{r['read_ratio']:.2f}"])
    for threads, r in record["loopback"].items():
        rows.append(["ceiling: loopback HTTP 16 MiB", str(threads), fmt(r["post"]), "", "", fmt(r["get"]), "", ""])
    b = record["blosc"]
    rows.append([f"ceiling: blosc lz4 (ratio {b['ratio']:.2f})", "1", fmt(b["compress"]), "", "",
                 fmt(b["decompress"]), "", ""])
    return rows


HEADER = ["base tier", "client threads", "direct write", "store PUT", "write/PUT", "direct read", "store GET",
          "read/GET"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and thread counts (< 3 minutes)")
    parser.add_argument("--backends", default="file,moto")
    args = parser.parse_args()
    rounds, thread_counts = (3, [1, 2]) if args.quick else (5, [1, 2, 4])
    volumes = [em_like((SC[2], SC[1], SC[0]), seed=i) for i in range(max(thread_counts))]
    bodies = [blosc.compress(v, typesize=1, cname="lz4", clevel=5) for v in volumes]
    objects = [encode_supercuboid(v, GRID.cuboid, GRID.cuboids_per_super) or b"" for v in volumes]
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds,
                              "blosc": blosc_rates(volumes[0], rounds), "backends": {},
                              "loopback": {t: loopback_rates(volumes[0].tobytes(), t, rounds) for t in thread_counts}}
    with tempfile.TemporaryDirectory(prefix="ndbench-store-") as tmp:
        for name, env, make_store in backends(args.backends.split(",")):
            record["backends"][name] = measure_backend(name, env, make_store(tmp), bodies, objects,
                                                       thread_counts, rounds)
    print(write_results("direct_io", record, table(record), HEADER))


if __name__ == "__main__":
    main()
