"""Peers on the same data. TensorStore, on the same S3 endpoint: writing and reading the benchmark's
volumes as a zarr array, one chunk per 512x512x64 region (the unit NDStore stores: a supercuboid,
16 MiB), compressed as NDStore's wire format is (blosc lz4, clevel 5, byte shuffle). Each client
thread writes/reads its own region, as bench_direct's threads do through the service. HSDS (with
POSIX storage, as NDStore's file base tier), through h5pyd, its chunks compressed the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import numpy.typing as npt

from benchmarks.common import AWS_TEST_CREDENTIALS, concurrent_rate, summary
from ndstore.ops.localstack import wait_until


def tensorstore_rates(endpoint: str, volumes: list[npt.NDArray[np.uint8]], thread_counts: list[int], rounds: int,
                      reps: int) -> dict[int, dict[str, Any]]:
    import tensorstore as ts

    os.environ.update(AWS_TEST_CREDENTIALS)  # moto takes any; TensorStore's S3 driver reads the environment
    bucket = f"peer-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    z, y, x = volumes[0].shape
    spec = {"driver": "zarr",
            "kvstore": {"driver": "s3", "bucket": bucket, "path": "vol/", "endpoint": endpoint,
                        "aws_region": "us-east-1"},
            "metadata": {"dtype": "|u1", "shape": [z, y, x * len(volumes)], "chunks": [z, y, x],
                         "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}},
            "create": True, "delete_existing": True}
    array = ts.open(spec).result()
    out = [np.empty_like(v) for v in volumes]

    def write(i: int) -> int:
        array[:, :, i * x:(i + 1) * x] = volumes[i]
        return volumes[i].nbytes

    def read(i: int) -> int:
        out[i][...] = array[:, :, i * x:(i + 1) * x].read().result()
        return volumes[i].nbytes

    results: dict[int, dict[str, Any]] = {}
    for threads in thread_counts:
        writes = [concurrent_rate(write, threads, reps) for _ in range(rounds)]
        reads = [concurrent_rate(read, threads, reps) for _ in range(rounds)]
        assert all(np.array_equal(out[i], volumes[i]) for i in range(threads)), "TensorStore read back other data"
        results[threads] = {"write": summary(writes), "read": summary(reads)}
    return results


# --- HSDS (the HDF Group's service), read and written through h5pyd ------------------------------

HSDS_PACKAGES = ("hsds==1.0.2", "h5pyd==1.0.0")
HSDS_VENV = Path(__file__).resolve().parent.parent / ".bench-venvs" / "hsds"

# Runs in the HSDS venv (its pins clash with ours): each thread writes, then reads, its own region
# of one dataset through h5pyd; prints {threads: {"write": [MB/s per round], "read": [...]}}.
_H5PYD_CLIENT = """
import json, sys, threading, time
import numpy as np, h5pyd
endpoint, paths, thread_counts, rounds, reps = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3]), \\
    int(sys.argv[4]), int(sys.argv[5])
kw = dict(endpoint=endpoint, username="admin", password="admin", bucket="bench")
for folder in ("/home/", "/home/admin/"):
    try:
        h5pyd.Folder(folder, mode="w", owner="admin", **kw)
    except Exception:
        pass  # there already
volumes = [np.load(p) for p in paths]
z, y, x = volumes[0].shape
with h5pyd.File("/home/admin/bench.h5", "w", **kw) as f:
    # compressed as NDStore's wire format and TensorStore's chunks are: blosc lz4, level 5, byte shuffle
    f.create_dataset("v", (z, y, x * len(volumes)), dtype="u1", chunks=(z, y // 2, x // 2), compression="lz4",
                     compression_opts=5, shuffle=True)

# One handle per thread for the whole run: HSDS answers a burst of opens with 503s
files = [h5pyd.File("/home/admin/bench.h5", "a", **kw) for _ in range(max(thread_counts))]

def rate(fn, threads):
    barrier = threading.Barrier(threads + 1)
    def work(i):
        barrier.wait()
        for _ in range(reps):
            fn(files[i]["v"], i)
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    [t.start() for t in pool]
    barrier.wait()
    start = time.perf_counter()
    [t.join() for t in pool]
    return threads * reps * volumes[0].nbytes / (time.perf_counter() - start) / 1e6

def write(d, i):
    d[:, :, i * x:(i + 1) * x] = volumes[i]

def read(d, i):
    assert np.array_equal(d[:, :, i * x:(i + 1) * x], volumes[i])

out = {t: {"write": [rate(write, t) for _ in range(rounds)], "read": [rate(read, t) for _ in range(rounds)]}
       for t in thread_counts}
files[0].flush()  # untimed: have HSDS store chunks, to measure what it stores
d = files[0]["v"]
print(json.dumps({"rates": out, "compression": d.compression, "compression_opts": d.compression_opts,
                  "shuffle": d.shuffle}))
"""


def _hsds_venv() -> Path:
    python = HSDS_VENV / "bin" / "python"
    stamp = HSDS_VENV / ".installed"
    if not stamp.exists() or stamp.read_text() != " ".join(HSDS_PACKAGES):
        subprocess.run([sys.executable, "-m", "venv", str(HSDS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *HSDS_PACKAGES], check=True)
        stamp.write_text(" ".join(HSDS_PACKAGES))
    return python


def hsds_rates(volumes: list[npt.NDArray[np.uint8]], thread_counts: list[int], rounds: int,
               reps: int) -> tuple[dict[int, dict[str, Any]], float | None]:
    """HSDS with POSIX storage in a temporary directory, its nodes on Unix sockets (it would bind
    every interface on TCP), 2 data nodes; h5pyd clients in its own venv. Chunks of 64x256x256
    (4 MiB, HSDS's default limit), blosc lz4 at level 5 with byte shuffle, as NDStore's wire
    format and the TensorStore peer's chunks (HSDS's default is uncompressed). HSDS answers a
    write once its data nodes hold the chunk in memory, and stores it later; its reads come from
    that memory too. Returns the rates and, after a flush once the rounds are done, the bytes of
    the chunks it stored over their raw bytes (its compression at work: uncompressed, at least 1;
    None if it stored none)."""
    python = _hsds_venv()
    with tempfile.TemporaryDirectory(prefix="ndbench-hsds-") as tmp:
        root, sockets = Path(tmp) / "data", Path(tmp) / "s"
        root.mkdir()
        sockets.mkdir()
        (root / "bench").mkdir()
        log = (Path(tmp) / "hsds.out").open("w")
        server = subprocess.Popen([str(python.parent / "hsds"), "--root_dir", str(root), "--bucket_name", "bench",
                                   "--socket_dir", str(sockets), "--count", "2", "--hs_username", "admin",
                                   "--hs_password", "admin", "--loglevel", "ERROR",
                                   "--logfile", str(Path(tmp) / "hsds.log")],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
        try:
            wait_until(lambda: "READY!" in (Path(tmp) / "hsds.out").read_text(), "HSDS", timeout=90)
            endpoint = "http+unix://" + f"{sockets}/sn_1.sock".replace("/", "%2F")
            paths = []
            for i, v in enumerate(volumes):
                paths.append(str(Path(tmp) / f"v{i}.npy"))
                np.save(paths[-1], v)
            script = Path(tmp) / "client.py"
            script.write_text(_H5PYD_CLIENT)
            done = subprocess.run([str(python), str(script), endpoint, ",".join(paths), json.dumps(thread_counts),
                                   str(rounds), str(reps)], capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"the h5pyd client failed ({done.returncode}):\n{done.stderr[-3000:]}")
            raw = json.loads(done.stdout.strip().splitlines()[-1])
            if (raw["compression"], raw["compression_opts"], raw["shuffle"]) != ("lz4", 5, True):
                raise RuntimeError(f"HSDS's dataset is not blosc lz4, level 5, with byte shuffle: {raw}")
            stored = _stored_chunks(root / "bench")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
            log.close()
    rates: dict[Any, Any] = {int(t): {k: summary(v) for k, v in r.items()} for t, r in raw["rates"].items()}
    count, nbytes = stored
    z, y, x = volumes[0].shape
    return rates, (nbytes / (count * z * (y // 2) * (x // 2)) if count else None)


def _stored_chunks(folder: Path, quiet_s: float = 1.0, timeout: float = 20) -> tuple[int, int]:
    """(count, bytes) of the chunk files HSDS stored under ``folder`` (its metadata files start
    with a dot), once they stop changing: HSDS stores chunks after it has answered the flush."""
    def chunks() -> tuple[int, int]:
        found = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
        return len(found), sum(p.stat().st_size for p in found)

    last, deadline = (-1, -1), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = chunks()
        if now == last and now[0] > 0:
            break
        last = now
        time.sleep(quiet_s)
    return last
