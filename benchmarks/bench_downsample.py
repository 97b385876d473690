"""Building the resolution hierarchy (the paper's scaling levels at this machine's scale):
MB/s of input per core for uint8 images (mean) and uint64 annotations (mode), through the SQS
path (one worker process polling, as the local runner does) and the Spark path (local[2]), beside
the reduce kernels' own numpy throughput measured in the same run.

    python -m benchmarks.bench_downsample [--quick]
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import AWS_TEST_CREDENTIALS, fmt, hardware, moto_server, summary, write_results
from ndstore.core.downsample import reduce_mean, reduce_mode
from ndstore.core.geometry import Box
from ndstore.core.synthetic import em_like, sparse_labels
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.ops.localstack import free_port, start_redis

HEADER = ["what", "data", "MB/s of input: median (min–max)", "per core", "ratio to the kernel"]
CASES = {"uint8 image": ("uint8", False), "uint64 annotation": ("uint64", True)}


def kernel_rate(dtype: str, annotation: bool, rounds: int) -> dict[str, float]:
    shape = (64, 1024, 1024) if dtype == "uint8" else (8, 1024, 1024)
    data = em_like(shape, seed=1) if not annotation else sparse_labels(shape, seed=1).astype(np.uint64)
    valid = tuple(np.ones(n, bool) for n in shape)
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        (reduce_mode if annotation else reduce_mean)(data, (1, 2, 2), valid)  # type: ignore[arg-type]
        rates.append(data.nbytes / (time.perf_counter() - start) / 1e6)
    return summary(rates)


def volume_for(dtype: str, annotation: bool, cid: int, quick: bool) -> tuple[ChannelVolume, np.ndarray]:
    z = (64 if dtype == "uint8" else 8) * (1 if quick else 2)
    frame = (1024, 1024, z)
    chan = ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), frame), 3, "anisotropic", 1,
                         annotation=annotation)
    shape = (z, 1024, 1024)
    data = sparse_labels(shape, seed=cid).astype(np.uint64) if annotation else em_like(shape, seed=cid)
    return chan, data


def input_bytes(chan: ChannelVolume) -> int:
    return sum(chan.extent(level).nvoxels * chan.dtype.itemsize for level in range(chan.num_levels - 1))


def engines(rounds: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ndbench-ds-") as tmp, moto_server() as moto:
        port = free_port()
        redis_proc = start_redis(Path(tmp) / "redis", port)
        saved = dict(os.environ)
        os.environ.update({**AWS_TEST_CREDENTIALS, "NDSTORE_DATA_DIR": tmp, "NDSTORE_OBJECT_STORE": "file",
                           "NDSTORE_INDEX": "sqlite", "NDSTORE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                           "NDSTORE_BLAZE_REDIS_URL": f"redis://127.0.0.1:{port}/1",
                           "NDSTORE_INGEST_ENDPOINT_URL": moto.url, "NDSTORE_FSYNC": "0",
                           "NDSTORE_SECRET_KEY": secrets.token_hex(16)})
        try:
            from lambdas.runner import QueuePoller
            from ndstore.engine.downsample import DownsampleJob
            from ndstore.engine.spark import spark_session
            from ndstore.engine.spark_downsample import build_hierarchy
            from ndstore.wiring import downsampler_for, services

            svc = services()
            spark = spark_session("local[2]", "ndstore-bench-downsample")
            job_ids = iter(range(1, 10_000))
            for i, (name, (dtype, annotation)) in enumerate(CASES.items()):
                chan, data = volume_for(dtype, annotation, i + 1, quick)
                svc.direct.write(Cutout(chan, 0, chan.extent(0), range(1)), data[None])
                nbytes = input_bytes(chan)
                sqs, spk = [], []
                for _ in range(rounds):
                    runs = svc.downsample_runs
                    job = DownsampleJob(next(job_ids), chan, runs.queue_prefix)
                    start = time.perf_counter()
                    runs.start(job)
                    poller = QueuePoller(runs.queues, runs.queue_prefix, refresh_s=0.2)
                    while runs.status(job)["state"] == "IN_PROGRESS":
                        if not poller.poll_once():
                            time.sleep(0.05)
                    sqs.append(nbytes / (time.perf_counter() - start) / 1e6)
                    runs.remove(job)
                    start = time.perf_counter()
                    result = build_hierarchy(spark, chan, svc.downsampler, partial(downsampler_for, svc.config))
                    assert result["state"] == "DOWNSAMPLED", result
                    spk.append(nbytes / (time.perf_counter() - start) / 1e6)
                out[name] = {"sqs": summary(sqs), "spark": summary(spk), "input_bytes": nbytes}
                print(name, out[name], flush=True)
            spark.stop()
        finally:
            os.environ.clear()
            os.environ.update(saved)
            redis_proc.terminate()
            redis_proc.wait()
    return out


def table(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name in CASES:
        kernel = record["kernel"][name]["median"]
        k = fmt(record["kernel"][name])
        rows.append([f"{name}: reduce kernel (numpy, 1 core)", name, k, k, ""])
        for engine, cores in (("sqs", 1), ("spark", 2)):
            r = record["engines"][name][engine]
            label = "SQS path, 1 worker process" if engine == "sqs" else "Spark path, local[2]"
            rows.append([f"{name}: {label}", name, fmt(r), f"{r['median'] / cores:.0f}",
                         f"{r['median'] / cores / kernel:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller volumes, fewer rounds")
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds}
    record["kernel"] = {name: kernel_rate(dtype, ann, rounds) for name, (dtype, ann) in CASES.items()}
    record["engines"] = engines(rounds, args.quick)
    notes = """
Input is every level's source: level 0, then level 1, ... (each level reads the one below).
Both engines read children and write parents through the cache tier's locks into a local file
base tier; the SQS path also pays moto's SQS and DynamoDB on the same two cores for each parent.
"""
    print(write_results("downsample", record, table(record), HEADER, extra_md=notes))


if __name__ == "__main__":
    main()
