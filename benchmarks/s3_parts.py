"""Objects in parts (parallel multipart PUTs and ranged GETs, ndstore/storage/s3.py) against whole
objects, at an S3-like rate per connection.

S3 serves each connection at a fraction of what it serves a client over several; moto on loopback
serves one request at a time (ndstore/ops/moto_endpoint.py) and copies the whole object for each
ranged GET, so it cannot show what parts are for. Here moto sits behind a proxy that passes each
connection's bytes, each way, at ``rate`` MB/s at most (an emulation of S3's per-connection rate,
not a measurement of S3), and one object at a time is written and read with each part size. The
ceiling of the same run is one connection's rate: what a whole-object GET or PUT can reach.

    python -m benchmarks.s3_parts [--rate 80] [--rounds 5]   (bench_direct runs it with its moto backend)
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.common import AWS_TEST_CREDENTIALS, fmt, markdown_table, moto_server, serving, summary
from benchmarks.supercuboids import workload
from ndstore.ops.localstack import free_port
from ndstore.storage.aws import Credentials
from ndstore.storage.s3 import S3ObjectStore

# (NDSTORE_S3_PART_BYTES, NDSTORE_S3_MULTIPART_THRESHOLD) of each way of storing an object
SETTINGS = {"whole objects (parts 0)": (0, 0), "8 MiB ranged GETs, one PUT (the defaults)": (8 << 20, 0),
            "8 MiB parts both ways (threshold 8 MiB)": (8 << 20, 8 << 20),
            "5 MiB parts both ways (threshold 5 MiB)": (5 << 20, 5 << 20)}
_CHUNK = 64 << 10
_IDLE_S = 0.05


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float) -> None:
    """Copy reader to writer at ``rate`` bytes/s; a connection idle for longer than _IDLE_S
    earns no credit (a sleep that overslept is made up for, an idle pause is not)."""
    due = 0.0
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
            now = time.perf_counter()
            due = (now if now - due > _IDLE_S else due) + len(data) / rate
            if due > now:
                await asyncio.sleep(due - now)
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _proxy(port: int, upstream: str, rate: float) -> None:
    host, upstream_port = upstream.removeprefix("http://").rsplit(":", 1)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, int(upstream_port))
        await asyncio.gather(_pump(client_r, server_w, rate), _pump(server_r, client_w, rate))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextmanager
def throttled(upstream: str, rate_mb_s: float) -> Iterator[str]:
    """A TCP proxy to ``upstream`` (http://host:port) in a process of its own (it must not share
    the client's interpreter lock), on a free 127.0.0.1 port: every connection carries at most
    ``rate_mb_s`` MB/s each way. Yields its URL; stopped on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.s3_parts", "--serve-proxy", str(port), upstream,
                             str(rate_mb_s)])
    with serving(proc, f"http://127.0.0.1:{port}", lambda status: status < 500, "throttling proxy") as server:
        yield server.url


def part_rates(endpoint: str, obj: bytes, rounds: int) -> dict[str, Any]:
    """MB/s of one object's PUT and GET through ``endpoint`` with each of SETTINGS, round by round."""
    credentials = Credentials(AWS_TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"], AWS_TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    stores = {name: S3ObjectStore(f"parts-{uuid.uuid4().hex[:10]}", endpoint, credentials=credentials,
                                  part_bytes=part, multipart_threshold=threshold)
              for name, (part, threshold) in SETTINGS.items()}
    rates: dict[str, dict[str, list[float]]] = {name: {"put": [], "get": []} for name in stores}
    for store in stores.values():
        store.ensure_ready()
        store.put_many({"warm": obj})
    for _ in range(rounds):
        for name, store in stores.items():
            start = time.perf_counter()
            store.put_many({"o": obj})
            put_s = time.perf_counter() - start
            start = time.perf_counter()
            [(_, back)] = list(store.get_many(["o"]))
            get_s = time.perf_counter() - start
            assert back == obj, f"{name}: the object came back changed"
            rates[name]["put"].append(len(obj) / put_s / 1e6)
            rates[name]["get"].append(len(obj) / get_s / 1e6)
    return {name: {op: summary(v) for op, v in r.items()} for name, r in rates.items()}


def measure(obj: bytes, rate_mb_s: float, rounds: int) -> dict[str, Any]:
    """SETTINGS through the throttle, and straight to moto (no per-connection limit)."""
    with moto_server() as moto:
        with throttled(moto.url, rate_mb_s) as capped:
            limited = part_rates(capped, obj, rounds)
        loopback = part_rates(moto.url, obj, rounds)
    return {"object_bytes": len(obj), "rate_per_connection": rate_mb_s, "rounds": rounds,
            "capped": limited, "moto": loopback}


RATE_MB_S = 80.0  # what one connection to S3 carries, about, from a node in the bucket's region
NOTES = """\
One encoded supercuboid object (the EM-like region's) is written and read back by
`S3ObjectStore` with each setting, one object at a time, rounds interleaved. "capped": through a
proxy (a process of its own) that carries each connection's bytes at the rate above each way, in
front of moto; the ceiling, one connection's rate, is what a whole-object GET or PUT can reach.
moto serves one request at a time, so parts sent at once are stored one after another (multipart
PUTs gain little here), and it copies the whole object for each ranged GET ("no cap" columns:
straight to moto, where parts only add requests). An emulation of S3's per-connection rate, not a
measurement of S3."""


def header(record: dict[str, Any]) -> list[str]:
    return [f"object of {record['object_bytes'] / (1 << 20):.1f} MiB", "PUT MB/s (capped)", "GET MB/s (capped)",
            "GET / one connection", "PUT MB/s (moto, no cap)", "GET MB/s (moto, no cap)"]


def table(record: dict[str, Any]) -> list[list[str]]:
    cap = record["rate_per_connection"]
    return [[name, fmt(r["put"]), fmt(r["get"]), f"{r['get']['median'] / cap:.2f}",
             fmt(record["moto"][name]["put"]), fmt(record["moto"][name]["get"])]
            for name, r in record["capped"].items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rate", type=float, default=RATE_MB_S, help="MB/s per connection, each way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve-proxy", nargs=3, metavar=("PORT", "UPSTREAM", "RATE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        port, upstream, rate = args.serve_proxy
        asyncio.run(_proxy(int(port), upstream, float(rate) * 1e6))
        return
    record = measure(workload(1)[2][0], args.rate, args.rounds)
    print(markdown_table(header(record), table(record)))


if __name__ == "__main__":
    main()
