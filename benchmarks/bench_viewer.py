"""Viewers and clients through the HTTP service: the latency of a 512x512 xy PNG tile from a hot
cache (p50, p99; goal <= 10 ms and <= 30 ms), beside the same plane as raw bytes (the read path
without the image) and a bare loopback round trip of a body that size; a 64³ cutout at a random
position from the hot cache; one Neuroglancer-style chunk (a cuboid: raw, or as stored for zarr)
through the precomputed, sharded precomputed (three ranged GETs, as a reader makes them) and zarr
views; and the Python client's
(`ndstore.client.Volume`) throughput reading 1 GiB with 8 parallel requests, beside loopback HTTP
with 8 threads.

    python -m benchmarks.bench_viewer [--quick]
"""

from __future__ import annotations

import argparse
import io
import random
import time
from typing import Any

import numpy as np
import requests
from PIL import Image

from benchmarks.common import (
    ADMIN_TOKEN,
    create_dataset,
    fmt,
    hardware,
    latencies,
    local_stack,
    loopback_http,
    loopback_rates,
    read_body,
    summary,
    write_results,
)
from ndstore.client import Volume
from ndstore.core.slices import encode_image, label_colours
from ndstore.core.synthetic import em_like

TILE = 512


def tile_latency(url: str, frame: tuple[int, int, int], n: int, rounds: int) -> dict[str, Any]:
    """Random 512x512 tiles of a hot volume, one client, a tile at a time (a viewer's fetch)."""
    s = requests.Session()
    s.headers["Authorization"] = f"Token {ADMIN_TOKEN}"
    x_tiles, y_tiles, z = frame[0] // TILE, frame[1] // TILE, frame[2]
    tiles = [(i, j, k) for i in range(x_tiles) for j in range(y_tiles) for k in range(0, z, 7)]
    rng = random.Random(0)

    def path(kind: str) -> str:
        i, j, k = rng.choice(tiles)
        xs, ys = f"{i * TILE}:{(i + 1) * TILE}", f"{j * TILE}:{(j + 1) * TILE}"
        if kind == "png":
            return f"{url}/v1/image/bench/e/c/xy/0/{xs}/{ys}/{k}/"
        return f"{url}/v1/cutout/bench/e/c/0/{xs}/{ys}/{k}:{k + 1}/"

    for _ in range(20):  # the client wrote the volume through the cache tier: it is hot already
        read_body(s, path("png"))
    png = [latencies(lambda: Image.open(io.BytesIO(read_body(s, path("png")))).load(), n) for _ in range(rounds)]
    raw = [latencies(lambda: read_body(s, path("raw"), {"Accept": "application/octet-stream"}), n)
           for _ in range(rounds)]
    with loopback_http(bytes(TILE * TILE)) as bare:
        loop = [latencies(lambda: read_body(s, bare), n) for _ in range(rounds)]
    def cube() -> None:
        x, y, z = rng.randrange(frame[0] - 64), rng.randrange(frame[1] - 64), rng.randrange(frame[2] - 64 + 1)
        read_body(s, f"{url}/v1/cutout/bench/e/c/0/{x}:{x + 64}/{y}:{y + 64}/{z}:{z + 64}/",
                  {"Accept": "application/octet-stream"})

    cubes = [latencies(cube, n) for _ in range(rounds)]
    array = s.get(f"{url}/zarr/bench/e/c/0/zarr.json", timeout=30).json()
    _, cz, cy, cx = array["chunk_grid"]["configuration"]["chunk_shape"]
    grid = (frame[0] // cx, frame[1] // cy, frame[2] // cz)

    shard_info = s.get(f"{url}/precomputed-sharded/bench/e/c/info", timeout=30).json()["scales"][0]["sharding"]
    shard_digits = -(-shard_info["shard_bits"] // 4)

    def chunk(view: str) -> None:
        i, j, k = (rng.randrange(g) for g in grid)
        if view == "zarr":
            read_body(s, f"{url}/zarr/bench/e/c/0/c/0/{k}/{j}/{i}")
        elif view == "sharded":  # a reader's three ranged GETs: shard index, minishard index, the chunk
            chunk_id = compressed_morton((i, j, k), grid)
            shard = f"{url}/precomputed-sharded/bench/e/c/0/" \
                    f"{chunk_id >> shard_info['preshift_bits']:0{shard_digits}x}.shard"
            start, end = np.frombuffer(read_body(s, shard, {"Range": "bytes=0-15"}), "<u8")
            index = np.frombuffer(read_body(s, shard, {"Range": f"bytes={16 + start}-{15 + end}"}), "<u8")
            ids, offsets, sizes = index.reshape(3, -1)
            at = int(np.searchsorted(np.cumsum(ids), chunk_id))
            first = 16 + int(np.cumsum(offsets)[at] + sizes[:at].sum())
            read_body(s, shard, {"Range": f"bytes={first}-{first + int(sizes[at]) - 1}"})
        else:
            name = f"{i * cx}-{(i + 1) * cx}_{j * cy}-{(j + 1) * cy}_{k * cz}-{(k + 1) * cz}"
            read_body(s, f"{url}/precomputed/bench/e/c/0/{name}")

    chunks = {view: [latencies(lambda: chunk(view), n) for _ in range(rounds)]  # noqa: B023 - called at once
              for view in ("precomputed", "sharded", "zarr")}
    plane = em_like((1, TILE, TILE), seed=9)[0]
    encode = [latencies(lambda: encode_image(plane, "png"), n) for _ in range(rounds)]
    colours = label_colours(label_plane())
    encode_labels = [latencies(lambda: encode_image(colours, "png"), n) for _ in range(rounds)]
    out = {kind: {q: summary([r[q] for r in runs]) for q in ("p50_ms", "p99_ms")}
           for kind, runs in (("png_tile", png), ("raw_plane", raw), ("loopback_256k", loop),
                              ("png_encode", encode), ("png_encode_labels", encode_labels), ("cutout_64", cubes),
                              ("chunk_precomputed", chunks["precomputed"]), ("chunk_zarr", chunks["zarr"]),
                              ("chunk_sharded", chunks["sharded"]))}
    out["png_encode_labels"]["bytes"] = len(encode_image(colours, "png"))
    return out


def label_plane() -> np.ndarray:
    """A 512x512 plane of an annotation channel: 400 labelled boxes over background."""
    rng = np.random.default_rng(3)
    plane = np.zeros((TILE, TILE), np.uint64)
    for _ in range(400):
        y, x = rng.integers(0, TILE - 32, 2)
        h, w = rng.integers(10, 80, 2)
        plane[y:y + h, x:x + w] = rng.integers(1, 2 ** 40)
    return plane


def compressed_morton(position: tuple[int, int, int], grid: tuple[int, int, int]) -> int:
    """Neuroglancer's chunk id: the grid position's bits interleaved x, y, z, each axis only as
    many bits as its grid size needs."""
    bits = [max(0, (g - 1).bit_length()) for g in grid]
    code, j = 0, 0
    for i in range(max(bits)):
        for axis in range(3):
            if i < bits[axis]:
                code |= (position[axis] >> i & 1) << j
                j += 1
    return code


def client_throughput(url: str, frame: tuple[int, int, int], rounds: int, parallel: int) -> dict[str, Any]:
    vol = Volume(url, "bench/e/c", token=ADMIN_TOKEN, parallel=parallel, progress_bytes=1 << 62)
    nbytes = frame[0] * frame[1] * frame[2]
    block = em_like((frame[2], TILE, TILE), seed=3)
    start = time.perf_counter()
    for j in range(0, frame[1], TILE):
        vol[:, j:j + TILE, :] = np.tile(block, (1, 1, frame[0] // TILE))
    write_s = time.perf_counter() - start
    reads = []
    for _ in range(rounds):
        start = time.perf_counter()
        got = vol[:, :, :]
        reads.append(nbytes / (time.perf_counter() - start) / 1e6)
        assert got.shape == (frame[2], frame[1], frame[0])
    return {"bytes": nbytes, "parallel": parallel, "read": summary(reads), "write_MBps": nbytes / write_s / 1e6}


HEADER = ["what", "figure", "goal / ceiling", "ratio"]


def table(record: dict[str, Any]) -> list[list[str]]:
    lat, thr = record["latency"], record["client"]
    png, raw, loop, enc = lat["png_tile"], lat["raw_plane"], lat["loopback_256k"], lat["png_encode"]
    loop_get = record["loopback"]["get"]["median"]
    return [
        ["512x512 xy PNG tile, hot cache, p50 ms", fmt(png["p50_ms"], 1), "goal ≤ 10",
         f"{png['p50_ms']['median'] / 10:.2f} of goal"],
        ["512x512 xy PNG tile, hot cache, p99 ms", fmt(png["p99_ms"], 1), "goal ≤ 30",
         f"{png['p99_ms']['median'] / 30:.2f} of goal"],
        ["same plane as raw bytes (no image), p50 / p99 ms", f"{fmt(raw['p50_ms'], 1)} / {fmt(raw['p99_ms'], 1)}", "",
         f"PNG tile = {png['p50_ms']['median'] / raw['p50_ms']['median']:.2f}x raw"],
        ["ceiling: loopback GET of 256 KiB, p50 / p99 ms", f"{fmt(loop['p50_ms'], 2)} / {fmt(loop['p99_ms'], 2)}", "",
         f"PNG tile = {png['p50_ms']['median'] / loop['p50_ms']['median']:.1f}x loopback"],
        ["PNG encode of the plane alone, p50 ms", fmt(enc["p50_ms"], 1), "", ""],
        *([["PNG encode of a 512x512 plane of labels (annotation colours, RGBA) alone, p50 ms; bytes",
            f"{fmt(lat['png_encode_labels']['p50_ms'], 1)}; {lat['png_encode_labels']['bytes']}", "", ""]]
          if "png_encode_labels" in lat else []),
        ["64³ cutout at a random position (raw), hot cache, p50 / p99 ms",
         f"{fmt(lat['cutout_64']['p50_ms'], 1)} / {fmt(lat['cutout_64']['p99_ms'], 1)}", "", ""],
        *([f"one chunk (a cuboid; zarr: as stored) through /{view}/"
           f"{' (3 ranged GETs)' if 'sharded' in view else ''}, "
           "hot cache, p50 / p99 ms",
           f"{fmt(lat[key]['p50_ms'], 1)} / {fmt(lat[key]['p99_ms'], 1)}", "",
           f"{lat[key]['p50_ms']['median'] / loop['p50_ms']['median']:.1f}x loopback 256 KiB"]
          for view, key in (("precomputed", "chunk_precomputed"), ("zarr", "chunk_zarr"),
                            ("precomputed-sharded", "chunk_sharded")) if key in lat),
        [f"Volume read of {thr['bytes'] >> 20} MiB, {thr['parallel']} parallel, MB/s", fmt(thr["read"]),
         f"loopback GET 16 MiB x{thr['parallel']}: {loop_get:.0f}", f"{thr['read']['median'] / loop_get:.2f}"],
        ["Volume write of the same (once), MB/s", f"{thr['write_MBps']:.0f}", "", ""],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB, fewer samples")
    args = parser.parse_args()
    rounds, n, frame = (3, 100, (2048, 2048, 64)) if args.quick else (5, 300, (4096, 4096, 64))
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds, "frame_xyz": frame,
                              "loopback": loopback_rates(bytes(16 << 20), 8, rounds)}
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}, with_merger=False) as stack:
        create_dataset(stack, frame)
        record["client"] = client_throughput(stack.url, frame, rounds, 8)
        print(f"client read {fmt(record['client']['read'])} MB/s", flush=True)
        record["latency"] = tile_latency(stack.url, frame, n, rounds)
    print(write_results("viewer", record, table(record), HEADER))


if __name__ == "__main__":
    main()
