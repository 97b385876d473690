"""Direct I/O of aligned 16 MiB regions through the HTTP service, against the base tier's own
rate measured in the same run (DESIGN.md §8: direct read/write >= 80% of the object store's rate).

Each client thread (its own requests.Session) writes or reads its own aligned supercuboid
(512x512x64 uint8, EM-like data) at /v1/direct/cutout/ with application/blosc bodies: bodies are
compressed before timing; responses are read with stream + raw.read() and decoded as a client
would. Base tiers: the local file store (fsync on, SQLite index) and S3 + DynamoDB on moto's
server (in a process of its own). Ceilings of the same run: the object store's own PUT/GET of the
very objects the service stores (interleaved round by round with the service figures, so each
ratio is taken under the same machine load), loopback HTTP of a 16 MiB body, and blosc on the data.

    python -m benchmarks.bench_direct [--quick] [--backends file,moto]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import numpy as np
from botocore.config import Config

from benchmarks import s3_parts
from benchmarks.common import (
    AWS_TEST_CREDENTIALS,
    CeilingStore,
    Stack,
    blosc_rates,
    client_decode,
    concurrent_rate,
    cpu_seconds,
    create_dataset,
    fmt,
    hardware,
    local_stack,
    loopback_rates,
    markdown_table,
    moto_server,
    object_store_rates,
    own_cpu_seconds,
    read_body,
    summary,
    write_results,
)
from benchmarks.peers import hsds_rates, tensorstore_rates
from benchmarks.supercuboids import REGION_BYTES, SC, workload
from ndstore.storage.filestore import FileObjectStore

__all__ = ["blosc_rates", "loopback_rates", "main", "open_backend"]  # bench_cache and profile_shortfalls import these

MEASURES = ("write", "put", "read", "get")


@dataclass(frozen=True)
class Settings:
    rounds: int
    reps: int  # requests per client thread in one round
    thread_counts: list[int]


QUICK = Settings(rounds=3, reps=2, thread_counts=[1, 2])
FULL = Settings(rounds=9, reps=3, thread_counts=[1, 2, 4])


# --- base-tier backends and their own PUT/GET ---------------------------------------------------


class FileCeiling:
    """The file store's own PUT/GET: FileObjectStore.put_many/get_many with fsync, as the service
    does it, in a directory of its own."""

    def __init__(self, root: Path):
        self.store = FileObjectStore(root, fsync=True)
        self.store.ensure_ready()

    def put(self, key: str, data: bytes) -> None:
        self.store.put_many({key: data})

    def get(self, key: str) -> bytes:
        ((_, blob),) = self.store.get_many([key])
        assert blob is not None
        return blob


class S3Ceiling:
    """boto3 put_object/get_object against the same endpoint, bucket of its own."""

    def __init__(self, endpoint: str, bucket: str = "ceiling-bucket"):
        creds = AWS_TEST_CREDENTIALS
        self.bucket = bucket
        self.s3 = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=creds["AWS_DEFAULT_REGION"],
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"], aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
            config=Config(max_pool_connections=16))
        self.s3.create_bucket(Bucket=bucket)

    def put(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            return body.read()  # type: ignore[no-any-return]
        finally:
            body.close()


@dataclass
class Backend:
    name: str
    env: dict[str, str]
    ceiling: CeilingStore
    store_pids: list[int] = field(default_factory=list)  # an object store in processes of its own


@contextmanager
def open_backend(name: str, scratch: Path) -> Iterator[Backend]:
    """The stack environment and the ceiling store of a base-tier backend ('file' or 'moto')."""
    if name == "file":
        yield Backend("file", {"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_FSYNC": "1"},
                      FileCeiling(scratch / "ceiling"))
    elif name == "moto":
        with moto_server() as moto:
            # whole-object GETs, as the store's own GET: moto serves one request at a time and copies
            # the whole object for every ranged GET (parts are measured apart: benchmarks/s3_parts.py)
            env = {"NDSTORE_OBJECT_STORE": "s3", "NDSTORE_S3_ENDPOINT_URL": moto.url, "NDSTORE_INDEX": "dynamodb",
                   "NDSTORE_DYNAMODB_ENDPOINT_URL": moto.url, "NDSTORE_S3_PART_BYTES": "0", **AWS_TEST_CREDENTIALS}
            yield Backend("moto", env, S3Ceiling(moto.url), [moto.pid])
    else:
        raise SystemExit(f"unknown backend {name!r}; use file and/or moto")


# --- the service ------------------------------------------------------------------------------


class DirectClient:
    """Client threads each writing/reading their own aligned region at /v1/direct/cutout/."""

    def __init__(self, stack: Stack, prefix: str, bodies: list[bytes], threads: int):
        self.urls = [self._url(stack, prefix, i) for i in range(threads)]
        self.sessions = [stack.session() for _ in range(threads)]
        self.bodies = bodies
        self.out = [np.empty((SC[2], SC[1], SC[0]), np.uint8) for _ in range(threads)]

    @staticmethod
    def _url(stack: Stack, prefix: str, i: int) -> str:
        x0 = i * SC[0]
        return f"{stack.url}/v1/direct/cutout/{prefix}/{x0}:{x0 + SC[0]}/0:{SC[1]}/0:{SC[2]}/"

    def write(self, i: int) -> int:
        r = self.sessions[i].post(self.urls[i], data=self.bodies[i], headers={"Content-Type": "application/blosc"})
        r.raise_for_status()
        return REGION_BYTES

    def read(self, i: int) -> int:
        client_decode(read_body(self.sessions[i], self.urls[i], {"Accept": "application/blosc"}), self.out[i])
        return REGION_BYTES

    def close(self) -> None:
        for s in self.sessions:
            s.close()


@dataclass
class CpuMeter:
    """CPU seconds of the service's processes, the object store's (moto; the file store runs in
    the service), and this client process, summed over the service measurements."""

    service: list[int]
    store: list[int]
    totals: dict[str, dict[str, float]] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        return {"service": cpu_seconds(self.service), "store": cpu_seconds(self.store), "client": own_cpu_seconds()}

    def rate(self, what: str, fn: Callable[[int], int], threads: int, reps: int) -> float:
        before = self._now()
        rate = concurrent_rate(fn, threads, reps)
        after = self._now()
        tally = self.totals.setdefault(what, dict.fromkeys(before, 0.0))
        for k in tally:
            tally[k] += after[k] - before[k]
        self.requests[what] = self.requests.get(what, 0) + threads * reps
        return rate

    def ms_per_region(self) -> dict[str, dict[str, float]]:
        return {what: {k: 1000 * v / self.requests[what] for k, v in tally.items()}
                for what, tally in self.totals.items()}


def measure_threads(client: DirectClient, backend: Backend, objects: list[bytes], threads: int,
                    settings: Settings, service_pids: list[int]) -> dict[str, Any]:
    """Rounds of (direct write, store PUT, direct read, store GET), interleaved; summaries, the
    per-round ratios write/PUT and read/GET, and CPU per region of the direct writes and reads."""
    rounds: dict[str, list[float]] = {m: [] for m in MEASURES}
    meter = CpuMeter(service_pids, backend.store_pids)
    # Warm-up, not counted: every thread's connection, worker and region, and every ceiling key.
    concurrent_rate(client.write, threads), concurrent_rate(client.read, threads)
    object_store_rates(backend.ceiling, objects, REGION_BYTES, threads)
    for _ in range(settings.rounds):
        rounds["write"].append(meter.rate("write", client.write, threads, settings.reps))
        store = object_store_rates(backend.ceiling, objects, REGION_BYTES, threads, settings.reps)
        rounds["read"].append(meter.rate("read", client.read, threads, settings.reps))
        rounds["put"].append(store["put"])
        rounds["get"].append(store["get"])
    out: dict[str, Any] = {m: summary(v) for m, v in rounds.items()}
    out["write_ratio"] = summary([w / p for w, p in zip(rounds["write"], rounds["put"])])
    out["read_ratio"] = summary([r / g for r, g in zip(rounds["read"], rounds["get"])])
    out["cpu_ms_per_region"] = meter.ms_per_region()
    return out


def measure_backend(backend: Backend, bodies: list[bytes], objects: list[bytes],
                    settings: Settings) -> dict[int, Any]:
    out: dict[int, Any] = {}
    with local_stack(backend.env) as stack:
        prefix = create_dataset(stack, (SC[0] * max(settings.thread_counts), SC[1], SC[2]))
        for threads in settings.thread_counts:
            client = DirectClient(stack, prefix, bodies, threads)
            try:
                out[threads] = r = measure_threads(client, backend, objects, threads, settings, stack.pids)
            finally:
                client.close()
            print(f"{backend.name} x{threads}: write {fmt(r['write'])} vs PUT {fmt(r['put'])}; "
                  f"read {fmt(r['read'])} vs GET {fmt(r['get'])}", flush=True)
    return out


# --- report -----------------------------------------------------------------------------------

HEADER = ["base tier", "client threads", "direct write", "store PUT", "write / PUT", "direct read", "store GET",
          "read / GET"]
CEILING_HEADER = ["ceiling (same run)", "client threads", "GET / decompress", "POST / compress"]
CPU_HEADER = ["base tier", "client threads", "direct write: service / store / client",
              "direct read: service / store / client"]


def table(record: dict[str, Any]) -> list[list[str]]:
    return [[name, str(t), fmt(r["write"]), fmt(r["put"]), fmt(r["write_ratio"], 2),
             fmt(r["read"]), fmt(r["get"]), fmt(r["read_ratio"], 2)]
            for name, by_threads in record["backends"].items() for t, r in by_threads.items()]


def ceiling_table(record: dict[str, Any]) -> list[list[str]]:
    rows = [["loopback HTTP, 16 MiB body", str(t), fmt(r["get"]), fmt(r["post"])]
            for t, r in record["loopback"].items()]
    b = record["blosc"]
    rows.append([f"python-blosc lz4 clevel 5, 16 MiB EM-like (ratio {b['ratio']:.2f})", "1", fmt(b["decompress"]),
                 fmt(b["compress"])])
    rows.append(["blosc2 decompress of that blosc1-format body", "1", fmt(b["blosc2_decompress"]), ""])
    return rows


def cpu_table(record: dict[str, Any]) -> list[list[str]]:
    def cell(c: dict[str, float]) -> str:
        return f"{c['service']:.0f} / {c['store']:.0f} / {c['client']:.0f}"

    return [[name, str(t), cell(r["cpu_ms_per_region"]["write"]), cell(r["cpu_ms_per_region"]["read"])]
            for name, by_threads in record["backends"].items() for t, r in by_threads.items()]


NOTES = """\
Each client thread writes/reads its own aligned 512x512x64 uint8 region (16 MiB) at
/v1/direct/cutout/ with application/blosc bodies; {reps} requests per thread per round, {rounds} rounds.
Store PUT/GET are the object store's own rates for the very objects the service stores (encoded
supercuboids, about {obj_ratio:.2f} of the raw bytes), counted in raw-voxel MB/s; file: FileObjectStore
put_many/get_many with fsync (GETs come from the page cache), moto: boto3 put_object/get_object
against moto's server in a process of its own. Ratios are the median (min–max) of per-round ratios,
each round measuring the service and the store back to back. The goal (DESIGN.md §8) is >= 0.80.
A file-store GET is a page-cache read, so there the practical ceiling is loopback HTTP; the JSON
also holds each figure's ratio to the loopback GET/POST of the same thread count. The blosc row is
python-blosc with its default 2 threads on a cache-warm buffer; the service encodes responses
with python-blosc and the client here decodes them with it (client_decode).
Peers (benchmarks/peers.py) write and read the same volumes, each client thread its own region:
TensorStore through its S3 driver to the same moto endpoint (compared with NDStore's moto base
tier); HSDS with POSIX storage in a temporary directory, 2 data nodes on Unix sockets, through
h5pyd (compared with NDStore's file base tier). Both peers compress as NDStore's wire format does
(blosc lz4, level 5, byte shuffle): TensorStore its zarr chunks, HSDS its chunks in storage.
HSDS acknowledges a write once its data nodes hold the chunk in memory and stores it later (in a
scratch run: none of it within 12 s; a flush then stored half the chunks at once), and its reads
come from that memory, so both its rates are memory rates; NDStore's direct write returns after
the object is stored and fsynced, and its direct read decodes the stored objects (in the page
cache). After the rounds a flush has HSDS store its chunks, and the bytes of those it stored show
its compression at work."""


PEER_HEADER = ["peer (its storage; NDStore's base tier compared)", "client threads", "peer write", "peer read",
               "NDStore direct write / peer", "NDStore direct read / peer"]
PEERS = {"tensorstore": ("TensorStore, zarr, one 16 MiB chunk per region, blosc lz4 (moto S3; moto)", "moto"),
         "hsds": ("HSDS 1.0.2 via h5pyd, 4 MiB chunks, blosc lz4 (POSIX; file)", "file")}


def peer_table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for peer, by_threads in record.get("peers", {}).items():
        what, backend = PEERS[peer]
        for threads, r in by_threads.items():
            per = record["backends"].get(backend, {})
            ours = per.get(threads) or per.get(str(threads))  # int keys in memory, str keys from JSON
            ratios = [f"{ours[k]['median'] / r[k]['median']:.2f}" if ours else "" for k in ("write", "read")]
            rows.append([what, str(threads), fmt(r["write"]), fmt(r["read"]), *ratios])
    return rows


def report(record: dict[str, Any]) -> str:
    stored = record.get("hsds_stored_ratio")
    hsds_stored = [f"HSDS's stored chunks (after a flush) hold {stored:.2f} of their raw bytes (blosc lz4 with "
                   f"byte shuffle; NDStore's objects: {record['object_ratio']:.2f})."] if stored else []
    peers = ["## Peers on the same data", markdown_table(PEER_HEADER, peer_table(record)), *hsds_stored] \
        if record.get("peers") else []
    parts = record.get("s3_parts")
    in_parts = [f"## One S3 object in parts, at {parts['rate_per_connection']:.0f} MB/s per connection (emulated)",
                markdown_table(s3_parts.header(parts), s3_parts.table(parts)), s3_parts.NOTES] if parts else []
    extra = "\n\n".join([
        *peers,
        *in_parts,
        "## Ceilings", markdown_table(CEILING_HEADER, ceiling_table(record)),
        "## CPU per 16 MiB region (ms; service = gunicorn, Redis and the daemons; store = moto's process)",
        markdown_table(CPU_HEADER, cpu_table(record)),
        NOTES.format(reps=record["reps"], rounds=record["rounds"], obj_ratio=record["object_ratio"]),
    ])
    return write_results("direct_io", record, table(record), HEADER, extra)


def add_loopback_ratios(record: dict[str, Any]) -> None:
    """Each backend's direct read / loopback GET and direct write / loopback POST (medians)."""
    for by_threads in record["backends"].values():
        for threads, r in by_threads.items():
            loop = record["loopback"][threads]
            r["read_vs_loopback_get"] = r["read"]["median"] / loop["get"]["median"]
            r["write_vs_loopback_post"] = r["write"]["median"] / loop["post"]["median"]


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and thread counts (< 3 minutes)")
    parser.add_argument("--backends", default="file,moto", help="comma-separated: file, moto")
    parser.add_argument("--no-hsds", action="store_true", help="skip the HSDS peer (it installs into .bench-venvs/)")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    volumes, bodies, objects = workload(max(settings.thread_counts))
    peer_threads = settings.thread_counts[-1:] if args.quick else settings.thread_counts
    record: dict[str, Any] = {
        "hardware": hardware(), "quick": args.quick, "rounds": settings.rounds, "reps": settings.reps,
        "region_bytes": REGION_BYTES, "object_ratio": len(objects[0]) / REGION_BYTES,
        "blosc": blosc_rates(volumes[0], max(settings.rounds, 5)), "backends": {},
        "loopback": {t: loopback_rates(volumes[0].tobytes(), t, settings.rounds, settings.reps)
                     for t in settings.thread_counts}}
    with tempfile.TemporaryDirectory(prefix="ndbench-store-") as tmp:
        for name in args.backends.split(","):
            with open_backend(name.strip(), Path(tmp)) as backend:
                record["backends"][backend.name] = measure_backend(backend, bodies, objects, settings)
                if backend.name == "moto":  # a peer on the same data and the same S3 endpoint
                    record["peers"] = {"tensorstore": tensorstore_rates(
                        backend.env["NDSTORE_S3_ENDPOINT_URL"], volumes, peer_threads, settings.rounds,
                        settings.reps)}
                    record["s3_parts"] = s3_parts.measure(objects[0], s3_parts.RATE_MB_S, max(settings.rounds, 5))
    if not args.no_hsds:
        hsds, stored_ratio = hsds_rates(volumes, peer_threads, settings.rounds, settings.reps)
        record.setdefault("peers", {})["hsds"] = hsds
        record["hsds_stored_ratio"] = stored_ratio
    add_loopback_ratios(record)
    print(report(record))


if __name__ == "__main__":
    main()
