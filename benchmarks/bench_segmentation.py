"""Segmentation products of label channels (docs/design/segmentation.md, DESIGN §8 and §11):

1. Per core (the process pinned to one CPU, zmesh and kimimaro single-threaded): MB/s of a
   supercuboid's voxels meshed by `mesh_fragment` (every level of detail, node by node, Draco)
   and skeletonized by `skeleton_fragment`, each beside zmesh alone (mesh + get of every label,
   level 0, no encoding) and kimimaro alone on the same block: goal >= 0.8 of them. Blocks:
   uint64 512x512x8 (tubes and blobs; a dense Voronoi segmentation) and 128^3 isotropic (dense),
   each with its one-voxel overlap, an inner supercuboid (no extent face to cap).
2. On a local stack (`ndstore up`'s processes, the runner polling the products queue
   `<prefix>-seg`, idle otherwise): the lag from a label write's 201 to its segment's mesh
   manifest (`/precomputed/.../mesh/{id}.index`) appearing, and to GET /v1/segmentation/
   saying no supercuboid is stale: p50 and p95 of N writes through `/v1/direct/cutout/` (goal
   p95 <= 30 s), and one through `/v1/cutout/` (the cache tier: its products follow the
   flusher's write-back, NDSTORE_FLUSH_AGE_S).
3. Sequential GET latency, p50 and p95, on channels of ~100 and ~5,000 labels: the segment
   properties file, a mesh manifest, and a Range read of a sharded mesh shard's index, beside the
   same stack's /healthz and the channel's `info` file (the cheapest precomputed GET: same front,
   worker, auth and channel lookup), and a plain WSGI app under gunicorn (no framework).

    python -m benchmarks.bench_segmentation [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import DracoPy
import numpy as np
import numpy.typing as npt
import requests
import zmesh

from benchmarks.common import fmt, hardware, local_stack, plain_wsgi_server, summary, write_results
from ndstore.core.geometry import XYZ, Box
from ndstore.core.segments import mesh
from ndstore.core.segments import skeleton as sk

Array = npt.NDArray[Any]
ANISO, ISO = (4.0, 4.0, 40.0), (8.0, 8.0, 8.0)
FRAME = (1024, 512, 16)  # x y z: 2 x 1 x 2 uint64 supercuboids of 512x512x8
COLL, EXP = "segb", "e"
OCTET = "application/octet-stream"
Summary2 = dict[str, float]

# --- blocks -----------------------------------------------------------------------------------


def dense_labels(shape_zyx: tuple[int, int, int], labels: int, voxel_nm: tuple[float, float, float],
                 seed: int = 0) -> Array:
    """A dense segmentation: the Voronoi cells (in nm) of random seeds, labels far apart."""
    from scipy.spatial import cKDTree  # installed with kimimaro

    rng = np.random.default_rng(seed)
    seeds = rng.uniform(0, 1, (labels, 3)) * np.array(shape_zyx[::-1]) * np.array(voxel_nm)
    z, y, x = np.indices(shape_zyx)
    _, nearest = cKDTree(seeds).query(np.stack([x.ravel(), y.ravel(), z.ravel()], 1) * np.array(voxel_nm))
    out: Array = (nearest.reshape(shape_zyx) + 1).astype(np.uint64) * np.uint64(1000003)
    return out


def tubes_block(shape_zyx: tuple[int, int, int], seed: int = 0, dtype: Any = np.uint64) -> Array:
    """Six slanted tubes (neurites, 60-160 nm in radius at 4x4x40 nm) and four blobs (somata-like),
    in background; the tubes' ids >= 2^63 in uint64."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[:shape_zyx[0], :shape_zyx[1], :shape_zyx[2]]
    out = np.zeros(shape_zyx, dtype)
    for i in range(6):
        y0, slope, r, zc = rng.uniform(40, shape_zyx[1] - 40), rng.uniform(-0.3, 0.3), rng.uniform(15, 40), \
            rng.uniform(2, shape_zyx[0] - 2)
        out[(y - (y0 + slope * x)) ** 2 + ((z - zc) * 10) ** 2 < r * r] = np.iinfo(dtype).max - i
    for i in range(4):
        cy, cx, r = rng.uniform(60, shape_zyx[1] - 60), rng.uniform(60, shape_zyx[2] - 60), rng.uniform(40, 80)
        out[(y - cy) ** 2 + (x - cx) ** 2 + ((z - shape_zyx[0] / 2) * 10) ** 2 < r * r] = 100 + i
    return out


def box_labels(shape_zyx: tuple[int, int, int], counts_zyx: tuple[int, int, int], seed: int) -> Array:
    """A dense grid of prod(counts_zyx) boxes, each a random uint64 id (spread over the shards)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 2**63, int(np.prod(counts_zyx)), np.uint64)
    idx = [np.arange(n) * c // n for n, c in zip(shape_zyx, counts_zyx)]
    cell = (idx[0][:, None, None] * counts_zyx[1] + idx[1][None, :, None]) * counts_zyx[2] + idx[2][None, None, :]
    out: Array = ids[cell]
    return out


# --- 1. per core --------------------------------------------------------------------------------


@contextmanager
def one_core() -> Iterator[int]:
    """This process on one CPU (its threads too), restored afterwards: the stack started later
    must not inherit it."""
    before = os.sched_getaffinity(0)
    cpu = max(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def timed(owner: Any, name: str, spent: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds spent in ``owner.name`` to ``spent[key]`` while inside."""
    real: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            spent[key] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def in_order(alone: Callable[[], float], product: Callable[[], float], alone_first: bool) -> tuple[float, float]:
    """Both timings, the library alone first or second (warm caches and a neighbour's load even out)."""
    if alone_first:
        a = alone()
        return a, product()
    p = product()
    return alone(), p


def mesh_round(block: Array, box: Box, cell: XYZ, voxel_nm: tuple[float, float, float],
               extent: Box, alone_first: bool = True) -> dict[str, float]:
    """One round: seconds of zmesh alone and of mesh_fragment (with its zmesh and Draco)."""
    def zmesh_alone() -> float:
        start = time.perf_counter()
        mesher = zmesh.Mesher(voxel_nm)
        mesher.mesh(block.T, close=False)
        for label in mesher.ids():
            mesher.get(label, normals=False, reduction_factor=0)
        return time.perf_counter() - start

    spent = {"zmesh": 0.0, "draco": 0.0}
    made: list[bytes | None] = []

    def fragment() -> float:
        with timed(DracoPy, "encode", spent, "draco"), timed(zmesh.Mesher, "mesh", spent, "zmesh"), \
                timed(zmesh.Mesher, "get", spent, "zmesh"):
            start = time.perf_counter()
            made.append(mesh.mesh_fragment(block, box, cell, voxel_nm, extent=extent))
            return time.perf_counter() - start

    alone, total = in_order(zmesh_alone, fragment, alone_first)
    blob = made[0]
    return {"zmesh_alone_s": alone, "mesh_fragment_s": total, "its_zmesh_s": spent["zmesh"],
            "its_draco_s": spent["draco"], "object_bytes": float(len(blob or b""))}


def skeleton_round(block: Array, cell: XYZ, voxel_nm: tuple[float, float, float],
                   alone_first: bool = True) -> dict[str, float]:
    """One round: seconds of kimimaro alone (the labels skeleton_fragment would hand it, its
    dust threshold) and of skeleton_fragment (bounds pass, kimimaro, shift, encoding), and of
    merging every label's piece into its skeleton file (what a skeleton GET does per piece)."""
    box = Box((0, 0, 0), cell)
    bounds = sk.SkeletonBounds()
    labels = sk.labels_to_skeletonize(block, bounds)
    made: list[bytes | None] = []

    def kimimaro_alone() -> float:
        start = time.perf_counter()
        sk.skeletonize(block, labels, voxel_nm, bounds.dust_threshold)
        return time.perf_counter() - start

    def product() -> float:
        start = time.perf_counter()
        made.append(sk.skeleton_fragment(block, box, cell, voxel_nm, bounds))
        return time.perf_counter() - start

    alone, fragment = in_order(kimimaro_alone, product, alone_first)
    blob = made[0]
    start = time.perf_counter()
    if blob is not None:
        for label in sk.fragment_labels(blob):
            sk.skeleton_of([blob], int(label))
    return {"kimimaro_alone_s": alone, "skeleton_fragment_s": fragment, "merge_s": time.perf_counter() - start,
            "skeleton_labels": float(len(labels)), "skeleton_bytes": float(len(blob or b""))}


def per_core(rounds: int) -> dict[str, Any]:
    cases: list[tuple[str, Callable[[], Array], XYZ, tuple[float, float, float]]] = [
             ("uint64 512x512x8, 6 tubes + 4 blobs", lambda: tubes_block((9, 513, 513)), (512, 512, 8), ANISO),
             ("uint64 512x512x8, dense 400 labels", lambda: dense_labels((9, 513, 513), 400, ANISO), (512, 512, 8),
              ANISO),
             ("uint64 128^3 isotropic, dense 60 labels", lambda: dense_labels((129, 129, 129), 60, ISO, 1),
              (128, 128, 128), ISO)]
    out: dict[str, Any] = {}
    with one_core() as cpu:
        for name, make, cell, voxel in cases:
            block = make()
            inside = Box(cell, (2 * cell[0], 2 * cell[1], 2 * cell[2]))  # an inner supercuboid: no face to cap
            extent = Box((0, 0, 0), (3 * cell[0], 3 * cell[1], 3 * cell[2]))
            runs = [{**mesh_round(block, inside, cell, voxel, extent, i % 2 == 0),  # alternate which runs first
                     **skeleton_round(block, cell, voxel, i % 2 == 0)} for i in range(rounds)]
            mb = block.nbytes / 1e6
            rates = {
                "zmesh_alone": [mb / r["zmesh_alone_s"] for r in runs],
                "mesh_fragment": [mb / r["mesh_fragment_s"] for r in runs],
                "mesh_ratio": [r["zmesh_alone_s"] / r["mesh_fragment_s"] for r in runs],
                "meshing_ratio_without_draco": [r["zmesh_alone_s"] / (r["mesh_fragment_s"] - r["its_draco_s"])
                                                for r in runs],
                "draco_share": [r["its_draco_s"] / r["mesh_fragment_s"] for r in runs],
                "kimimaro_alone": [mb / r["kimimaro_alone_s"] for r in runs],
                "skeleton_fragment": [mb / r["skeleton_fragment_s"] for r in runs],
                "skeleton_ratio": [r["kimimaro_alone_s"] / r["skeleton_fragment_s"] for r in runs],
                "merge_ms": [r["merge_s"] * 1e3 for r in runs],
            }
            out[name] = {"block_mb": mb, "labels": len(np.unique(block)), "runs": runs,
                         **{k: summary(v) for k, v in rates.items()}}
            f = out[name]
            print(f"{name}: mesh {fmt(f['mesh_fragment'], 1)} MB/s vs zmesh {fmt(f['zmesh_alone'], 1)} "
                  f"({fmt(f['mesh_ratio'], 2)}); skeleton {fmt(f['skeleton_fragment'], 1)} vs kimimaro "
                  f"{fmt(f['kimimaro_alone'], 1)} ({fmt(f['skeleton_ratio'], 2)})", flush=True)
    return {"cpu": cpu, "cases": out}


# --- the stack ----------------------------------------------------------------------------------


def quantiles(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {"p50": statistics.median(ordered), "p95": ordered[round(0.95 * (len(ordered) - 1))],
            "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


class Api:
    """The service over HTTP: ``admin`` with the token, ``anon`` with none (the channels are public)."""

    def __init__(self, url: str, headers: dict[str, str]):
        self.url = url
        self.admin = requests.Session()
        self.admin.headers.update(headers)
        self.anon = requests.Session()

    def post(self, path: str, **kw: Any) -> requests.Response:
        r = self.admin.post(f"{self.url}{path}", timeout=120, **kw)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST {path} answered {r.status_code}: {r.text[:300]}")
        return r

    def status(self, channel: str) -> dict[str, Any]:
        r = self.anon.get(f"{self.url}/v1/segmentation/{COLL}/{EXP}/{channel}/", timeout=30)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def write(self, channel: str, lo: XYZ, data: Array, tier: str = "direct/cutout") -> float:
        """POST ``data`` (z, y, x) at ``lo``; the seconds the write took to answer."""
        (z, y, x), (x0, y0, z0) = data.shape, lo
        start = time.perf_counter()
        self.post(f"/v1/{tier}/{COLL}/{EXP}/{channel}/0/{x0}:{x0 + x}/{y0}:{y0 + y}/{z0}:{z0 + z}/",
                  data=data.tobytes(), headers={"Content-Type": OCTET})
        return time.perf_counter() - start

    def wait_current(self, channel: str, timeout_s: float) -> float:
        """Seconds until no supercuboid of ``channel`` is stale and the queue is empty."""
        start = time.perf_counter()
        while time.perf_counter() - start < timeout_s:
            s = self.status(channel)
            if s["stale"] == 0 and s["queue"]["waiting"] == 0 and s["queue"]["in_flight"] == 0:
                return time.perf_counter() - start
            time.sleep(0.2)
        raise RuntimeError(f"{channel}: still stale after {timeout_s} s: {self.status(channel)}")


def create_channels(api: Api, channels: list[str]) -> None:
    x, y, z = FRAME
    api.post("/v1/coord/segbframe/", json={"x_stop": x, "y_stop": y, "z_stop": z, "x_voxel_size": ANISO[0],
                                            "y_voxel_size": ANISO[1], "z_voxel_size": ANISO[2],
                                            "voxel_unit": "nanometers"})
    api.post(f"/v1/collection/{COLL}/", json={})
    r = api.admin.put(f"{api.url}/v1/collection/{COLL}/", json={"public": True}, timeout=30)
    r.raise_for_status()
    api.post(f"/v1/collection/{COLL}/experiment/{EXP}/", json={"coord_frame": "segbframe", "num_hierarchy_levels": 1,
                                                              "hierarchy_method": "anisotropic"})
    for ch in channels:
        api.post(f"/v1/collection/{COLL}/experiment/{EXP}/channel/{ch}/", json={"type": "annotation",
                                                                            "datatype": "uint64"})


def manifest_url(api: Api, channel: str, label: int) -> str:
    return f"{api.url}/precomputed/{COLL}/{EXP}/{channel}/mesh/{label}.index"


def lag_spots(n: int) -> list[XYZ]:
    """Where the i-th write's 32x32x4 box lands: inside one supercuboid (off its low faces, so
    the new segment's pieces are all in it), across the four supercuboids in turn."""
    spots = []
    for i in range(n):
        sx, sz = i % 2, (i // 2) % 2
        k = i // 4
        spots.append((sx * 512 + 40 + (k * 97) % 400, 40 + (k * 61) % 400, sz * 8 + 2))
    return spots


def one_lag(api: Api, channel: str, label: int, lo: XYZ, tier: str, timeout_s: float) -> dict[str, float]:
    """Write a 32x32x4 box of a new ``label`` at ``lo``, then poll its manifest (404 until it
    appears) and the channel's status (stale until 0) every 50 ms; seconds from the write's 201."""
    box = np.full((4, 32, 32), label, np.uint64)
    write_s = api.write(channel, lo, box, tier)
    start = time.perf_counter()
    seen_stale = api.status(channel)["stale"]
    manifest_s = status_s = None
    url = manifest_url(api, channel, label)
    while time.perf_counter() - start < timeout_s and (manifest_s is None or status_s is None):
        if manifest_s is None:
            r = api.anon.get(url, timeout=30)
            if r.status_code == 200:
                manifest_s = time.perf_counter() - start
            elif r.status_code != 404:
                raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:200]}")
        if status_s is None:
            stale = api.status(channel)["stale"]
            seen_stale = max(seen_stale, stale)
            if stale == 0 and (seen_stale or manifest_s is not None):  # a cache-tier write is marked when written back
                status_s = time.perf_counter() - start
        time.sleep(0.05)
    if manifest_s is None or status_s is None:
        raise RuntimeError(f"label {label}: no mesh / still stale after {timeout_s} s")
    return {"write_s": write_s, "manifest_s": manifest_s, "status_s": status_s, "stale_after_write": seen_stale}


def lags(api: Api, writes: int, flush_age_s: float) -> dict[str, Any]:
    channel = "lag"
    build_s = [api.write(channel, (0, 0, 0), tubes_block(FRAME[::-1], seed=5))]
    initial = api.wait_current(channel, 900)
    runs = []
    for i, lo in enumerate(lag_spots(writes)):
        api.wait_current(channel, 300)  # an idle stack: nothing queued
        runs.append(one_lag(api, channel, 10_000 + i, lo, "direct/cutout", 300))
        print(f"  direct write {i}: manifest after {runs[-1]['manifest_s']:.2f} s, stale 0 after "
              f"{runs[-1]['status_s']:.2f} s", flush=True)
    api.wait_current(channel, 300)
    cached = one_lag(api, channel, 20_000, (700, 300, 10), "cutout", 300)
    print(f"  cache-tier write: manifest after {cached['manifest_s']:.2f} s", flush=True)
    out: dict[str, Any] = {"initial_write_s": build_s[0], "initial_build_s": initial, "direct": runs,
                           "cache_tier": cached, "flush_age_s": flush_age_s}
    for key in ("manifest_s", "status_s", "write_s"):
        out[f"direct_{key}"] = quantiles([r[key] for r in runs])
    return out


def latency_rounds(fn: Callable[[], object], n: int, rounds: int) -> dict[str, Summary2]:
    """``rounds`` of ``n`` sequential calls: the median (min-max) over rounds of p50 and p95, ms."""
    p50, p95 = [], []
    for _ in range(rounds):
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        q = quantiles(times)
        p50.append(q["p50"])
        p95.append(q["p95"])
    return {"p50_ms": summary(p50), "p95_ms": summary(p95)}



def get_ok(session: requests.Session, url: str, headers: dict[str, str] | None = None,
           ok: tuple[int, ...] = (200,)) -> Callable[[], bytes]:
    def fn() -> bytes:
        r = session.get(url, headers=headers, timeout=60)
        if r.status_code not in ok:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:200]}")
        return r.content
    return fn


def anonymous_manifests(api: Api, channel: str, label: int, most: int) -> dict[str, Any]:
    """Anonymous GETs of one manifest until the first 429 (each is charged the fragment objects
    it reads to the address's read budget, NDSTORE_ANON_READ_BYTES_*), at most ``most``."""
    url, start = manifest_url(api, channel, label), time.perf_counter()
    for i in range(most):
        r = api.anon.get(url, timeout=60)
        if r.status_code == 429:
            return {"before_429": i, "seconds": time.perf_counter() - start}
        r.raise_for_status()
    return {"before_429": None, "seconds": time.perf_counter() - start, "tried": most}


def read_latencies(api: Api, label_channels: dict[str, Array], n: int, rounds: int) -> dict[str, Any]:
    s = api.admin  # with the token: anonymous readers are charged each manifest's fragment objects (below)
    out: dict[str, Any] = {"healthz": latency_rounds(get_ok(s, f"{api.url}/healthz"), n, rounds)}
    with plain_wsgi_server() as plain:  # a trivial GET with no framework, auth or storage
        out["plain_wsgi"] = latency_rounds(get_ok(s, plain.url), n, rounds)
    for ch, data in label_channels.items():
        labels = np.unique(data)
        labels = labels[labels != 0]
        label = int(labels[len(labels) // 2])
        base, sharded = f"{api.url}/precomputed/{COLL}/{EXP}/{ch}", f"{api.url}/precomputed-sharded/{COLL}/{EXP}/{ch}"
        props = get_ok(s, f"{base}/segment_properties/info")()
        shard = f"{sharded}/mesh/{mesh.shard_name(mesh.shard_of(label))}"
        index = get_ok(s, shard, {"Range": "bytes=0-15"}, (206,))()
        assert len(index) == 16, len(index)
        out[ch] = {"labels": len(labels), "properties_bytes": len(props),
                   "info": latency_rounds(get_ok(s, f"{base}/info"), n, rounds),
                   "segment_properties": latency_rounds(get_ok(s, f"{base}/segment_properties/info"), n, rounds),
                   "manifest": latency_rounds(get_ok(s, f"{base}/mesh/{label}.index"), n, rounds),
                   "shard_index": latency_rounds(get_ok(s, shard, {"Range": "bytes=0-15"}, (206,)), n, rounds)}
        print(f"  {ch}: properties p50 {fmt(out[ch]['segment_properties']['p50_ms'], 1)} ms, manifest p50 "
              f"{fmt(out[ch]['manifest']['p50_ms'], 1)} ms, shard index p50 {fmt(out[ch]['shard_index']['p50_ms'], 1)}",
              flush=True)
    ch = list(label_channels)[-1]
    labels = np.unique(label_channels[ch])
    out["anonymous_manifests"] = {"channel": ch, **anonymous_manifests(api, ch, int(labels[-1]), 2000)}
    print(f"  anonymous manifest GETs before a 429: {out['anonymous_manifests']}", flush=True)
    return out


def on_stack(writes: int, n: int, rounds: int) -> dict[str, Any]:
    flush_age = float(os.environ.get("NDSTORE_FLUSH_AGE_S", "5"))
    with local_stack({"NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite"}, with_merger=False) as stack:
        api = Api(stack.url, stack.session_headers)
        props = {"p100": box_labels(FRAME[::-1], (2, 5, 10), 1), "p5000": box_labels(FRAME[::-1], (4, 25, 50), 2)}
        create_channels(api, ["lag", *props])
        out: dict[str, Any] = {"load_before": os.getloadavg()}
        out["lag"] = lags(api, writes, flush_age)
        out["load_after_lag"] = os.getloadavg()
        out["builds"] = {}
        for ch, data in props.items():
            write_s = api.write(ch, (0, 0, 0), data)
            out["builds"][ch] = {"write_s": write_s, "build_s": api.wait_current(ch, 1800),
                                 "labels": int(len(np.unique(data)))}
            print(f"  {ch}: {out['builds'][ch]['labels']} labels, 4 supercuboids rebuilt in "
                  f"{out['builds'][ch]['build_s']:.1f} s", flush=True)
        out["latency"] = read_latencies(api, props, n, rounds)
        out["load_after"] = os.getloadavg()
    return out


# --- the record ---------------------------------------------------------------------------------

HEADER = ["what", "figure: median (min–max)", "ceiling / goal, same run", "ratio"]


def table(record: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, f in record["per_core"]["cases"].items():
        rows.append([f"meshing, {name} ({f['labels']} labels), MB/s on 1 core", fmt(f["mesh_fragment"], 1),
                     f"zmesh alone {fmt(f['zmesh_alone'], 1)}; goal ≥ 0.8", fmt(f["mesh_ratio"], 2)])
        rows.append([f"… meshing without the Draco encoding (Draco {f['draco_share']['median']:.0%} of the time)",
                     "", "zmesh alone", fmt(f["meshing_ratio_without_draco"], 2)])
        rows.append([f"skeletonizing, {name}, MB/s on 1 core", fmt(f["skeleton_fragment"], 1),
                     f"kimimaro alone {fmt(f['kimimaro_alone'], 1)}; goal ≥ 0.8", fmt(f["skeleton_ratio"], 2)])
    lag = record["stack"]["lag"]
    for key, what in (("manifest_s", "mesh manifest appears"), ("status_s", "GET /v1/segmentation/ stale = 0")):
        q = lag[f"direct_{key}"]
        rows.append([f"label write (/v1/direct/cutout/, 32x32x4) to {what}, s: p50 / p95 (min–max), "
                     f"{q['n']} writes", f"{q['p50']:.2f} / {q['p95']:.2f} ({q['min']:.2f}–{q['max']:.2f})",
                     "goal p95 ≤ 30", f"{q['p95'] / 30:.2f} of goal"])
    c = lag["cache_tier"]
    rows.append([f"label write through the cache tier (/v1/cutout/, flusher's write-back after "
                 f"{lag['flush_age_s']:.0f} s) to its manifest / stale = 0, s, 1 write",
                 f"{c['manifest_s']:.2f} / {c['status_s']:.2f}", "", ""])
    for b in record["stack"]["builds"].values():
        rows.append([f"rebuild of a written channel's 4 supercuboids (uint64 512x512x8), {b['labels']} labels, s",
                     f"{b['build_s']:.1f}", "", ""])
    lat = record["stack"]["latency"]
    ceiling = lat["healthz"]
    for ch in ("p100", "p5000"):
        L = lat[ch]
        for key, what in (("info", "the channel's info file"), ("segment_properties", "segment_properties/info"),
                          ("manifest", "mesh/{id}.index"), ("shard_index", "sharded mesh shard index (Range 0-15)")):
            v = L[key]
            size = f" ({L['properties_bytes'] >> 10} KiB)" if key == "segment_properties" else ""
            rows.append([f"GET {what}{size}, {L['labels']} labels, ms: p50 / p95",
                         f"{fmt(v['p50_ms'], 1)} / {fmt(v['p95_ms'], 1)}",
                         f"/healthz {ceiling['p50_ms']['median']:.1f} / {ceiling['p95_ms']['median']:.1f}",
                         f"{v['p50_ms']['median'] / ceiling['p50_ms']['median']:.1f}x / "
                         f"{v['p95_ms']['median'] / ceiling['p95_ms']['median']:.1f}x"])
    anon = lat.get("anonymous_manifests")
    if anon:
        rows.append([f"anonymous GETs of one manifest ({lat[anon['channel']]['labels']} labels) before the first "
                     f"429 (read budget)", f"{anon['before_429']} in {anon['seconds']:.1f} s", "", ""])
    rows.append(["ceiling: GET /healthz of the same stack, ms: p50 / p95",
                 f"{fmt(ceiling['p50_ms'], 2)} / {fmt(ceiling['p95_ms'], 2)}", "", ""])
    plain = lat["plain_wsgi"]
    rows.append(["ceiling: GET of a plain WSGI app under gunicorn (no framework, auth, storage), ms: p50 / p95",
                 f"{fmt(plain['p50_ms'], 2)} / {fmt(plain['p95_ms'], 2)}", "", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 3 lag writes, 2x30 GETs")
    args = parser.parse_args()
    rounds, writes, n, lat_rounds = (2, 3, 30, 2) if args.quick else (3, 10, 50, 3)
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, "rounds": rounds,
                              "load_at_start": os.getloadavg()}
    record["per_core"] = per_core(rounds)
    record["load_after_per_core"] = os.getloadavg()
    record["stack"] = on_stack(writes, n, lat_rounds)
    loads = [record["load_at_start"], record["load_after_per_core"], record["stack"]["load_before"],
             record["stack"]["load_after_lag"], record["stack"]["load_after"]]
    extra = (f"Meshing and skeletonizing: this process pinned to CPU {record['per_core']['cpu']} (one core, "
             "zmesh and kimimaro single-threaded), blocks with their one-voxel overlap, an inner supercuboid; "
             "ratio = the library alone's time / the product's time, per round. The stack: `ndstore up`'s "
             "processes (2 gunicorn workers, the runner's 2 worker processes polling the products queue, "
             "file object store, SQLite index), idle but for the benchmark; lags polled anonymously (public channels), "
             "latencies read with the token, "
             "sequential, one client. The host has 2 cores shared with other work: 1-min load average at "
             "start / after per-core / before the stack's figures / after the lags / at the end: "
             + " / ".join(f"{x[0]:.2f}" for x in loads) + ".")
    units = "Per-core figures: MB/s of the block's raw voxels; latencies in ms; lags in s."
    print(write_results("segmentation", record, table(record), HEADER, extra, units=units))


if __name__ == "__main__":
    main()
