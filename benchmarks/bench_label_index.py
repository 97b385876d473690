"""The label index's costs and gains (docs/design/label-index.md), in one process on the local
default (a directory, SQLite files, a redis-server of its own):

- counting one 16 MiB uint64 supercuboid of segmentation-like labels: fastremap against
  np.unique, and decoding the object first (what a write-back does);
- a store of one such supercuboid by the base tier (encode + put, fsync off) in a label channel
  the index keeps against one it does not: a first write (every label new) and a rewrite that
  moves 1% of the voxels (a few counts change);
- `boundingbox` of a label held by one supercuboid, and `ids` of a whole level, on a level of
  `--supercuboids` stored supercuboids: answered from the index against a voxel scan (the same
  channel before it is registered: what every release before the index did).

    python -m benchmarks.bench_label_index [--supercuboids 32] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastremap
import numpy as np
import numpy.typing as npt

from benchmarks.common import fmt, hardware, summary, write_results
from ndstore import wiring
from ndstore.config import Config
from ndstore.core.chunks import decode_supercuboid, encode_supercuboid
from ndstore.core.geometry import Box
from ndstore.engine.dataplane import Write
from ndstore.engine.label_index import rebuild
from ndstore.engine.volume import ChannelVolume, make_cutout
from ndstore.ops.localstack import free_port, start_redis

Array = npt.NDArray[Any]


def segmentation(shape_zyx: tuple[int, int, int], labels: int, seed: int) -> Array:
    """Blocks of about `labels` distinct random uint64 ids, 0 in a corner (a segmentation's look
    to a counter: long runs of one id, ids scattered over 64 bits)."""
    side = max(1, round((shape_zyx[0] * shape_zyx[1] * shape_zyx[2] / labels) ** (1 / 3)))
    z, y, x = np.indices(shape_zyx)
    blocks = (z // side) * 1_000_000 + (y // side) * 1000 + x // side
    _, inverse = np.unique(blocks, return_inverse=True)
    ids = np.random.default_rng(seed).integers(1, 2**64 - 1, inverse.max() + 1, np.uint64, endpoint=True)
    out: Array = ids[inverse].reshape(shape_zyx)
    out[:, :64, :64] = 0
    return out


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times


def channel(cid: int, grid_xyz: tuple[int, int, int]) -> ChannelVolume:
    probe = ChannelVolume(1, 1, cid, np.dtype(np.uint64), Box((0, 0, 0), (1, 1, 1)), 1, "anisotropic", 1)
    sc = probe.grid(0).supercuboid
    frame = Box((0, 0, 0), (sc[0] * grid_xyz[0], sc[1] * grid_xyz[1], sc[2] * grid_xyz[2]))
    return ChannelVolume(1, 1, cid, np.dtype(np.uint64), frame, 1, "anisotropic", 1, annotation=True)


def counting(rounds: int) -> list[list[str]]:
    ch = channel(1, (1, 1, 1))
    grid = ch.grid(0)
    rows = []
    for labels in (500, 2500, 20000):
        whole = segmentation(grid.supercuboid[::-1], labels, labels)
        blob = encode_supercuboid(whole, grid.cuboid, grid.cuboids_per_super)
        assert blob is not None
        found = len(fastremap.unique(whole))
        rows.append([f"count {found} labels (fastremap)", fmt(summary(timed(
            lambda w=whole: fastremap.unique(w, return_counts=True), rounds)), 1)])
        rows.append([f"count {found} labels (np.unique)", fmt(summary(timed(
            lambda w=whole: np.unique(w, return_counts=True), rounds)), 1)])
        rows.append([f"decode the object ({len(blob) >> 10} KiB)", fmt(summary(timed(
            lambda b=blob: decode_supercuboid(b), rounds)), 1)])
    return rows


def storing(svc: wiring.Services, rounds: int) -> list[list[str]]:
    assert svc.labels is not None
    kept, plain = channel(2, (1, 1, 1)), channel(3, (1, 1, 1))
    svc.labels.register([kept.name_prefix], complete=True)
    grid, base = kept.grid(0), svc.cache_tier._base
    whole = segmentation(grid.supercuboid[::-1], 2500, 7)
    moved = whole.copy()
    moved[:, :, :5] = moved[:, :, 5:10]  # 1% of the voxels: counts change, few labels come or go
    rows = []
    for ch, what in ((plain, "not kept"), (kept, "kept (SQLite)")):
        volume = ch.volume_key(0, 0)
        firsts = []
        for r in range(1, rounds + 1):  # a supercuboid never stored: every label new
            started = time.perf_counter()
            base.store_array(volume.supercuboid(r), whole, grid)
            firsts.append((time.perf_counter() - started) * 1000)
        rows.append([f"store a 16 MiB supercuboid, first write, {what}", fmt(summary(firsts), 1)])
        rewrites = []
        for r in range(rounds):
            started = time.perf_counter()
            base.store_array(volume.supercuboid(1), moved if r % 2 == 0 else whole, grid)
            rewrites.append((time.perf_counter() - started) * 1000)
        rows.append([f"store a 16 MiB supercuboid, 1% rewritten, {what}", fmt(summary(rewrites), 1)])
    return rows


def reads(svc: wiring.Services, count: int, rounds: int) -> list[list[str]]:
    assert svc.labels is not None
    nx = max(1, count // 4)
    ch = channel(4, (nx, 2, 2))
    sx, sy, sz = ch.grid(0).supercuboid
    for n, (i, j, k) in enumerate((i, j, k) for i in range(nx) for j in range(2) for k in range(2)):
        box = Box((i * sx, j * sy, k * sz), ((i + 1) * sx, (j + 1) * sy, (k + 1) * sz))
        data = segmentation((sz, sy, sx), 500, 100 + n)
        if (i, j, k) == (nx - 1, 1, 1):
            data[2:4, 10:20, 10:20] = 77
        svc.plane.write(make_cutout(ch, 0, box, range(1), 1 << 40), data[None], Write.DIRECT)
    level = make_cutout(ch, 0, ch.extent(0), range(1), 1 << 40)
    rows, answers = [], []
    for what in ("voxel scan", "label index"):
        if what == "label index":  # the channel registered and indexed: what its creation does today
            rebuild(svc.labels, svc.objects, svc.locks, [ch.name_prefix], sleep=lambda _: None)
        answers.append((svc.plane.bounding_box(ch, 0, 77, loose=False), svc.plane.ids(level).tolist()))
        box_ms = timed(lambda: svc.plane.bounding_box(ch, 0, 77, loose=False), rounds)
        ids_ms = timed(lambda: svc.plane.ids(level), rounds)
        rows.append([f"boundingbox, {nx * 4} supercuboids, {what}", fmt(summary(box_ms), 1)])
        rows.append([f"ids of the whole level, {nx * 4} supercuboids, {what}", fmt(summary(ids_ms), 1)])
    assert answers[0] == answers[1], "the index answers what the scan answers"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--supercuboids", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 supercuboids, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.supercuboids, args.rounds = 8, 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ports = free_port(), free_port()
        servers = [start_redis(root / f"redis{i}", port, appendfsync="no") for i, port in enumerate(ports)]
        try:
            time.sleep(0.5)
            settings = {"NDSTORE_DATA_DIR": str(root / "data"), "NDSTORE_OBJECT_STORE": "file",
                        "NDSTORE_INDEX": "sqlite", "NDSTORE_LOCKS": "redis", "NDSTORE_FSYNC": "0",
                        "NDSTORE_REDIS_URL": f"redis://127.0.0.1:{ports[0]}/0",
                        "NDSTORE_BLAZE_REDIS_URL": f"redis://127.0.0.1:{ports[1]}/0"}
            svc = wiring.build(Config.from_env(settings))
            svc.cache_tier.loss.verify()
            svc.blaze_ledger.verify()
            table = counting(args.rounds) + storing(svc, args.rounds) + reads(svc, args.supercuboids, args.rounds)
            svc.close()
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=10)
    record = {"hardware": hardware(), "rows": table}
    print(write_results("label_index", record, table, ["what", "ms (median [min-max])"], units="Milliseconds."))


if __name__ == "__main__":
    main()
