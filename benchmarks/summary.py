"""Every DESIGN.md §8 figure in one table, from the latest results/*.json of each benchmark, with
its goal, its ratio to the ceiling measured in the same run, and the paper-style plots.

    python -m benchmarks.summary        (make bench and make bench-quick run it last)

Writes results/summary.md, results/summary.json and results/fig{7,8,9,10}.png. A figure whose
benchmark has not run says so; nothing is filled in from elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, fmt

Record = dict[str, Any]
SOURCES = ("direct_io", "cache_tier", "blaze", "ingest", "downsample", "viewer", "load", "reliability", "memory",
           "segmentation", "views")


def load() -> dict[str, Record]:
    found = {}
    for name in SOURCES:
        path = RESULTS / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def _run(rec: Record) -> str:
    hw = rec["hardware"]
    return f"{hw.get('date', '?')[:10]}{' quick' if rec.get('quick') else ''}"


def rows(results: dict[str, Record]) -> list[list[str]]:
    out: list[list[str]] = []

    def row(figure: str, goal: str, source: str, build: Callable[[Record], tuple[str, str, str]]) -> None:
        rec = results.get(source)
        if rec is None:
            out.append([figure, goal, "not run", "", "", f"`{source}`"])
            return
        try:
            measured, ceiling, verdict = build(rec)
        except (KeyError, IndexError, ZeroDivisionError) as exc:
            measured, ceiling, verdict = f"not in this run ({exc})", "", ""
        out.append([figure, goal, measured, ceiling, verdict, f"`{source}` {_run(rec)}"])

    def cache(kind: str, threads: str, ceiling: str, goal: float) -> Callable[[Record], tuple[str, str, str]]:
        def build(r: Record) -> tuple[str, str, str]:
            value = r["cache"][threads][kind]
            if ceiling == "loopback":
                c, what = r["loopback"][threads]["get"]["median"], "loopback GET"
            else:
                c, what = r["redis"]["hset"]["median"], "Redis HSET"
            ratios = f"{value['median'] / c:.2f} of {what} ({c:.0f})"
            proto = r.get("prototype", {}).get(threads)
            if proto is not None and kind in proto:
                p = proto[kind]["median"]
                ratios += f"; {value['median'] / p:.2f} of DESIGN §8's prototype in the same run ({p:.0f}"
                without = proto.get(f"{kind}_no_aof")
                ratios += f"; {without['median']:.0f} into a Redis without AOF)" if without else ")"
            return fmt(value), ratios, _verdict(value["median"], goal)
        return build

    row("hot-cache read, 2 client threads, MB/s", "≥ 650", "cache_tier", cache("hot_read", "2", "loopback", 650))
    row("cold-cache read, 2 client threads, MB/s", "≥ 400", "cache_tier", cache("cold_read", "2", "loopback", 400))
    row("cache write, 2 client threads, MB/s", "≥ 600", "cache_tier", cache("write", "2", "redis", 600))

    def direct(kind: str) -> Callable[[Record], tuple[str, str, str]]:
        def build(r: Record) -> tuple[str, str, str]:
            best = max(r["backends"]["moto"].values(), key=lambda v: v[f"{kind}_ratio"]["median"])
            ratio = best[f"{kind}_ratio"]
            store = best["put" if kind == "write" else "get"]
            return (fmt(best[kind]), f"{fmt(ratio, 2)} of the store's own {'PUT' if kind == 'write' else 'GET'} "
                    f"({store['median']:.0f})", "met" if ratio["median"] >= 0.8 else
                    f"short: {ratio['median'] / 0.8:.2f} of goal")
        return build

    row("direct write to the base tier (moto S3), MB/s", "≥ 0.8 of store PUT", "direct_io", direct("write"))
    row("direct read from the base tier (moto S3), MB/s", "≥ 0.8 of store GET", "direct_io", direct("read"))

    def blaze(r: Record) -> tuple[str, str, str]:
        mode = next(iter(r["modes"].values()))  # the default: AOF, as `ndstore up` runs it
        best_size, threads, best = max(((s, t, v) for s, by in mode["blaze"].items() for t, v in by.items()),
                                       key=lambda p: p[2]["median"])
        cache_write = max(v["median"] for v in mode["cache_write"].values())
        factor = best["median"] / cache_write
        redis_set = mode.get("redis_set_clients", {}).get(best_size, {}).get(threads, mode["redis_set"][best_size])
        return (f"{fmt(best)} ({best_size} blobs, {threads} threads)", f"{best['median'] / redis_set['median']:.2f} "
                f"of Redis SET of the body (as many clients); {factor:.1f}x the cache write", _verdict(factor, 5.0))

    row("NDBlaze burst write acceptance (AOF), MB/s", "≥ 5x cache write", "blaze", blaze)

    def blaze_small(r: Record) -> tuple[str, str, str]:
        ratios = {w: q["blaze_writes_per_s"]["median"] / q["cache_writes_per_s"]["median"]
                  for w, q in r["small_writes"].items()}
        worst = min(ratios, key=lambda w: ratios[w])
        q = r["small_writes"][worst]
        return (f"NDBlaze {fmt(q['blaze_writes_per_s'])} vs cache tier {fmt(q['cache_writes_per_s'])} ({worst} "
                f"writers, the lowest ratio)", ", ".join(f"{w} writers: {x:.1f}x" for w, x in ratios.items()),
                _verdict(ratios[worst], 5.0))

    row("NDBlaze small 64×64×8 writes, 8–32 writers, writes/s (both Redis fsync every write)", "≥ 5x the cache tier",
        "blaze", blaze_small)

    def tile(q: str, goal: float) -> Callable[[Record], tuple[str, str, str]]:
        def build(r: Record) -> tuple[str, str, str]:
            lat = r["latency"]
            value = lat["png_tile"][q]
            loop = lat["loopback_256k"][q]["median"]
            return (fmt(value, 1) + " ms", f"{value['median'] / loop:.1f}x loopback 256 KiB ({loop:.2f} ms); "
                    f"raw plane {lat['raw_plane'][q]['median']:.1f} ms",
                    "met" if value["median"] <= goal else f"short: {value['median'] / goal:.2f}x goal")
        return build

    row("512×512 xy PNG tile, hot cache, p50", "≤ 10 ms", "viewer", tile("p50_ms", 10))
    row("512×512 xy PNG tile, hot cache, p99", "≤ 30 ms", "viewer", tile("p99_ms", 30))

    def ingest(r: Record) -> tuple[str, str, str]:
        s = r["supercuboids"]
        value = s["build_1"]
        return (fmt(value) + " per worker", f"{value['median'] / s['png_decode']['median']:.2f} of PNG decode "
                f"({s['png_decode']['median']:.0f}); {value['median'] / s['tile_get']['median']:.2f} of tile GET",
                "reported")

    row("ingest supercuboid generation, MB/s per core", "reported with ratio", "ingest", ingest)

    def downsample(r: Record) -> tuple[str, str, str]:
        parts = []
        for data, kernel in r["kernel"].items():
            sqs = r["engines"][data]["sqs"]
            parts.append(f"{data}: SQS {sqs['median']:.0f} = {sqs['median'] / kernel['median']:.2f} of kernel")
        return "; ".join(parts), "numpy reduce kernel, 1 core", "reported"

    row("downsampling, MB/s per core", "reported with ratio", "downsample", downsample)

    def client(r: Record) -> tuple[str, str, str]:
        c = r["client"]
        loop = r["loopback"]["get"]["median"]
        return (fmt(c["read"]), f"{c['read']['median'] / loop:.2f} of loopback GET x{c['parallel']} ({loop:.0f})",
                "reported")

    row("Volume client, 1 GiB read, 8 parallel, MB/s", "reported", "viewer", client)

    def peer(name: str, label: str, backend: str) -> Callable[[Record], tuple[str, str, str]]:
        """DESIGN §8: NDStore >= 1x the peer on the same data with the same compression, reads and
        writes: the verdict is the lower of the two ratios, at the peer's most client threads."""
        def build(r: Record) -> tuple[str, str, str]:
            threads, theirs = max(r["peers"][name].items(), key=lambda p: int(p[0]))
            ours = r["backends"][backend][threads]
            ratios = {k: ours[k]["median"] / theirs[k]["median"] for k in ("read", "write")}
            return (f"{label} read {fmt(theirs['read'])}, write {fmt(theirs['write'])} ({threads} threads)",
                    f"NDStore direct ({backend}) / {label}: read {ratios['read']:.2f}, write {ratios['write']:.2f}",
                    _verdict(min(ratios.values()), 1.0))
        return build

    row("TensorStore (zarr) on the same data and S3 endpoint, blosc lz4 both sides, MB/s",
        "NDStore ≥ 1x, reads and writes", "direct_io", peer("tensorstore", "TensorStore", "moto"))
    row("HSDS (h5pyd) on the same data, blosc lz4 both sides, MB/s", "NDStore ≥ 1x, reads and writes", "direct_io",
        peer("hsds", "HSDS", "file"))

    def small(r: Record) -> tuple[str, str, str]:
        threads, best = max(r["small_writes"].items(), key=lambda p: p[1]["writes_per_s"]["median"])
        value, loop = best["writes_per_s"], best["loopback_posts_per_s"]["median"]
        return (f"{fmt(value)} ({threads} threads)", f"{value['median'] / loop:.2f} of loopback POSTs/s ({loop:.0f})",
                _verdict(value["median"], 400))

    row("small random 64×64×8 writes through the cache tier, writes/s", "≥ 400", "cache_tier", small)

    def tiny(name: str) -> Callable[[Record], tuple[str, str, str]]:
        def build(r: Record) -> tuple[str, str, str]:
            t, plain = r["tiny"][name], r["tiny"]["plain_wsgi_ms"][name]["median"]
            value = t["service_ms"]["median"]
            return (f"{fmt(t['service_ms'], 2)} ms (web workers alone {fmt(t['web_ms'], 2)})",
                    f"web workers {t['web_ms']['median'] / plain:.0f}x plain WSGI under gunicorn ({plain:.2f} ms)",
                    "met" if value <= 2 else f"short: {value / 2:.2f}x goal")
        return build

    row("tiny request: 64×64×8 write, server CPU per request (web, Redis, daemons, front)", "≤ 2 ms", "cache_tier",
        tiny("write_64x64x8"))
    row("tiny request: 1-voxel read, server CPU per request", "≤ 2 ms", "cache_tier", tiny("read_1_voxel"))

    def cube(r: Record) -> tuple[str, str, str]:
        c = r["latency"]["cutout_64"]
        return f"p50 {fmt(c['p50_ms'], 1)} / p99 {fmt(c['p99_ms'], 1)} ms", "", "reported"

    row("64³ cutout, hot cache, latency", "reported", "viewer", cube)

    def load_run(r: Record) -> tuple[str, str, str]:
        clean = r["total_errors"] == 0 and r["total_lost"] == 0
        return (f"{r['load_minutes']:.1f} load-minutes, {r['total_requests']} requests: {r['total_errors']} errors, "
                f"{r['total_lost']} lost writes", "", "met" if clean else "short")

    row("mixed load (viewers, pipeline, annotators, NDBlaze), errors and lost writes", "0 and 0", "load", load_run)

    def faults(r: Record) -> tuple[str, str, str]:
        f = r["faults"]
        return (f"{f['scenarios']} scenarios: {f['passed']} passed, {f['xfailed']} known exceptions (strict xfail, "
                f"docs/reliability.md), {f['failed']} failed", "", "met" if f["failed"] == 0 else "short")

    row("fault scenarios run (tests/faults), each with zero lost writes", "all pass", "reliability", faults)

    def fuzz(r: Record) -> tuple[str, str, str]:
        z = r["fuzz"]
        return (f"{z['cases']} cases in {z['tests']} tests (scale {r['scale']:g}): {z['failed']} failed",
                "", "met" if z["failed"] == 0 else "short")

    row("fuzz cases run (schemathesis over the API, hypothesis over the decoders): no 500, no corruption",
        "0 failures", "reliability", fuzz)

    def memory(r: Record) -> tuple[str, str, str]:
        reads = {name: q for name, q in r["requests"].items() if name.startswith("read")}
        name, worst = max(reads.items(), key=lambda item: item[1]["grown_mib"]["median"])
        answer = worst["answer_bytes"]
        constant = (2 * r["window_bytes"] + r["retained_bytes"]) >> 20
        within = all(q["grown_mib"]["max"] <= (2 * q["answer_bytes"] >> 20) + constant for q in reads.values())
        return (f"{fmt(worst['grown_mib'])} MiB for a {answer >> 20} MiB answer ({name})",
                f"{fmt(worst['ratio'], 2)} x the answer; bound 2 x + {constant} MiB (two read windows, glibc's "
                f"retention)", "met" if within else "short")

    row("memory: peak RSS growth of a worker serving the largest allowed read", "≤ 2x the response + a documented "
        "constant", "memory", memory)

    def products(kind: str, product: str, library: str) -> Callable[[Record], tuple[str, str, str]]:
        def build(r: Record) -> tuple[str, str, str]:
            cases = r["per_core"]["cases"]
            worst = min(cases, key=lambda name: cases[name][f"{kind}_ratio"]["median"])
            ratios = "; ".join(f"{name}: {fmt(c[f'{kind}_ratio'], 2)}" for name, c in cases.items())
            return (f"{fmt(cases[worst][product], 1)} ({worst}, the lowest ratio)", f"of {library} alone: {ratios}",
                    _verdict(cases[worst][f"{kind}_ratio"]["median"], 0.8))
        return build

    row("meshing, MB/s per core", "≥ 0.8 of zmesh alone", "segmentation", products("mesh", "mesh_fragment", "zmesh"))
    row("skeletonizing, MB/s per core", "≥ 0.8 of kimimaro alone", "segmentation",
        products("skeleton", "skeleton_fragment", "kimimaro"))

    def lag(r: Record) -> tuple[str, str, str]:
        q = r["stack"]["lag"]["direct_manifest_s"]
        return (f"p50 {q['p50']:.1f} / p95 {q['p95']:.1f} s ({q['min']:.1f}–{q['max']:.1f}, {q['n']} writes)", "",
                "met" if q["p95"] <= 30 else f"short: {q['p95'] / 30:.2f} of goal")

    row("a label write (direct) reaching its mesh manifest, idle stack", "p95 ≤ 30 s", "segmentation", lag)

    def views(prefix: str, kinds: tuple[str, ...], key: str, goal: float) -> Callable[[Record], tuple[str, str, str]]:
        """Issue 50: the chunk views against a static copy of their files on nginx, same run, same
        client; a ratio is 1.0 at static's speed (throughputs NDStore / static, times static /
        NDStore) and the verdict is the lowest of the views'."""
        unit, digits, is_time = {"MBps": ("MB/s", 0, False), "s": ("s", 2, True)}.get(key, ("ms", 2, True))

        def build(r: Record) -> tuple[str, str, str]:
            figures = r["neuroglancer" if prefix == "neuroglancer" else "readers"]
            ratios = {k: figures[f"{prefix}_{k}"]["ratio"][key]["median"] ** (-1 if is_time else 1) for k in kinds}
            worst = min(ratios, key=lambda k: ratios[k])
            m = figures[f"{prefix}_{worst}"]
            several = len(kinds) > 1
            return (f"{fmt(m['ndstore'][key], digits)} {unit}, static {fmt(m['static'][key], digits)}"
                    + (f" ({worst}, the lowest ratio)" if several else ""),
                    "of static: " + ", ".join(f"{k + ' ' if several else ''}{v:.2f}" for k, v in ratios.items()),
                    _verdict(ratios[worst], goal))
        return build

    row("chunk views: TensorStore reading level 0 whole over HTTP (zarr3, precomputed, sharded), MB/s",
        "≥ 0.7 of static", "views", views("tensorstore", ("zarr3", "precomputed", "sharded"), "MBps", 0.7))
    row("chunk views: CloudVolume reading level 0 whole, 1 thread, MB/s", "≥ 0.9 of static", "views",
        views("cloudvolume", ("1",), "MBps", 0.9))
    row("chunk views: one chunk, sequential GETs (zarr, precomputed), p50", "≤ 1.5x static", "views",
        views("chunk", ("zarr", "precomputed"), "p50_ms", 1 / 1.5))
    row("chunk views: one chunk, sequential GETs (zarr, precomputed), p99", "≤ 2x static", "views",
        views("chunk", ("zarr", "precomputed"), "p99_ms", 1 / 2))
    row("chunk views: Neuroglancer drawing a 4-panel view (zarr3, precomputed)", "≤ 1.2x static", "views",
        views("neuroglancer", ("zarr3", "precomputed"), "s", 1 / 1.2))
    return out


# The profile of each figure's requests (python -m benchmarks.profile_shortfalls <workload>), by
# the figure's first words; docs/design/serving.md says what was done about each and what is left.
PROFILES = {
    "hot-cache read": "hot_read", "cold-cache read": "cold_read", "cache write": "cache_write",
    "direct write": "direct_write", "direct read": "direct_read", "NDBlaze small": "blaze_small_writes",
    "NDBlaze": "blaze_write", "512×512 xy PNG tile": "tile", "small random": "small_writes",
    "tiny request: 64×64×8 write": "small_writes", "tiny request: 1-voxel read": "tiny_read",
    "TensorStore": "direct_read", "HSDS": "direct_read", "chunk views": "chunk",
}


def why_short(table: list[list[str]], top: int = 5) -> list[str]:
    """For every figure short of its goal: its profile, the profile's run and its hottest
    functions by own time, read from results/profile_<workload>.md."""
    lines = ["## Where the time goes in each figure short of its goal", "",
             "Profiles by `python -m benchmarks.profile_shortfalls` (py-spy over the web workers while the figure's "
             "requests run, and every process's CPU per request over the same requests, beside the cores' whole "
             "time per request and, for a rate goal, the time per request that would meet it); what was done "
             "about each and what is left: docs/design/serving.md.", ""]
    for figure, goal, *_, verdict, _source in table:
        if not verdict.startswith("short"):
            continue
        workload = next((w for start, w in PROFILES.items() if figure.startswith(start)), None)
        path = RESULTS / f"profile_{workload}.md"
        if figure.startswith("meshing"):  # not a request: bench_segmentation splits mesh_fragment's time itself
            lines.append(f"- {figure}: [segmentation.md](segmentation.md) splits mesh_fragment's time (the Draco "
                         "encoding's share, meshing without it against zmesh alone); docs/design/meshes.md says why")
            continue
        if workload is None or not path.exists():
            lines.append(f"- {figure}: no profile yet (`python -m benchmarks.profile_shortfalls {workload or ''}`)")
            continue
        text = path.read_text().splitlines()
        run = next((line for line in text[1:] if line.strip()), "")
        hottest = [line.split("|")[1:3] for line in text if line.startswith("| ") and "%" in line.split("|")[1]][:top]
        what = text[0].removeprefix("# profile: ")
        lines.append(f"- {figure}: [{path.name}]({path.name}) ({what}; {run}) "
                     + machine_of(path.with_suffix(".json"), figure, goal)
                     + "Hottest by own time: " + ", ".join(f"{f.strip()} {share.strip()}" for share, f in hottest))
    return lines


def goal_machine_ms(figure: str, goal: str, cores: int, request_bytes: int) -> float | None:
    """The machine's time per request (cores x wall / requests) at a rate goal: what every
    process together may spend on one request for the figure to meet it. None for goals that are
    not rates (latencies, ratios to a ceiling or to another figure)."""
    number = goal.removeprefix("≥ ").strip()
    if not goal.startswith("≥ ") or not number.replace(".", "", 1).isdigit():
        return None
    if "MB/s" in figure and request_bytes:
        return cores * 1e3 * request_bytes / (float(number) * 1e6)
    if "writes/s" in figure:
        return cores * 1e3 / float(number)
    return None


def machine_of(path: Path, figure: str, goal: str) -> str:
    """Where the machine's cores went per request in the profile's run (profile_<workload>.json)."""
    if not path.exists():
        return ""
    m = json.loads(path.read_text())
    parts = ", ".join(f"{part} {ms:.1f}" for part, ms in m["cpu_ms_per_request"].items() if ms >= 0.05)
    at_goal = goal_machine_ms(figure, goal, m["cores"], m["request_bytes"])
    return (f"CPU ms per request by process: {parts}, idle {m['idle_ms_per_request']:.1f}, of "
            f"{m['machine_ms_per_request']:.1f} ({m['cores']} cores x wall time per request)"
            + (f"; at the goal all of them together have {at_goal:.1f}" if at_goal else "") + ". ")


def _goal_ceilings(results: dict[str, Record]) -> list[tuple[str, float, float, str]]:
    """(figure, its goal, a ceiling of this machine measured in the same run, what that ceiling
    is) for the goals a service must pass through such a ceiling to reach: the goal in the
    figure's units against the most the ceiling lets through."""
    out: list[tuple[str, float, float, str]] = []
    cache, blaze, direct = results.get("cache_tier"), results.get("blaze"), results.get("direct_io")
    hset = (cache or {}).get("redis", {}).get("hset_clients", {}).get("2")
    if hset:
        out.append(("cache write, 2 client threads, MB/s", 600.0, hset["median"],
                    "MB/s of a supercuboid's cuboids stored in the stack's Redis (appendfsync always) by 2 clients "
                    "at once, which every cache write does"))
    mode = next(iter(blaze["modes"].values())) if blaze else {}
    if mode.get("redis_set_clients"):
        cache_write = max(v["median"] for v in mode["cache_write"].values())
        sets = [(s, "1", v["median"]) for s, v in mode["redis_set"].items()]
        sets += [(s, t, v["median"]) for s, by in mode["redis_set_clients"].items() for t, v in by.items()]
        size, clients, redis_set = max(sets, key=lambda p: p[2])
        out.append(("NDBlaze burst write acceptance (AOF), MB/s", 5 * cache_write, redis_set,
                    f"MB/s of Redis SETs of the {size} body by {clients} client(s) at once into the buffer's Redis "
                    f"(AOF), the most of any body size and client count; every NDBlaze write does one; the goal is 5x "
                    f"the cache write ({cache_write:.0f})"))
    if blaze:
        for writers, q in blaze.get("small_writes", {}).items():
            if "loopback_posts_per_s" in q:
                out.append((f"NDBlaze small 64×64×8 writes, {writers} writers, writes/s",
                            5 * q["cache_writes_per_s"]["median"], q["loopback_posts_per_s"]["median"],
                            f"POSTs/s of the same body to a bare HTTP server on loopback, {writers} writers; the goal "
                            f"is 5x the cache tier ({q['cache_writes_per_s']['median']:.0f})"))
    for name, label in (("hsds", "HSDS"), ("tensorstore", "TensorStore")):
        if direct and name in direct.get("peers", {}):
            threads, theirs = max(direct["peers"][name].items(), key=lambda p: int(p[0]))
            for kind, verb in (("read", "GET"), ("write", "POST")):
                out.append((f"{label} {kind}s on the same data, MB/s", theirs[kind]["median"],
                            direct["loopback"][threads][verb.lower()]["median"],
                            f"MB/s of 16 MiB {verb}s to a bare HTTP server on loopback, {threads} threads; the goal "
                            f"is {label}'s {kind}"))
    return out


def beyond_ceilings(results: dict[str, Record]) -> list[str]:
    """Which goals exceed a ceiling of this machine measured in the same run: there no service
    could meet them here, and the figure's shortfall says more about the machine than the code."""
    lines = ["## Goals beyond a ceiling of this machine", "",
             "Each of these goals is above a ceiling measured in the same run that the figure's requests must go "
             "through: on this machine no code could meet it, and ceiling / goal is the most of it reachable here. "
             "Ceilings are medians of runs on a shared host (their min–max is in the benchmark's own table).", ""]
    found = [f"- {figure}: goal {goal:.0f}, ceiling {ceiling:.0f} ({what}): at most {ceiling / goal:.2f} of the goal "
             "is reachable here" for figure, goal, ceiling, what in _goal_ceilings(results) if goal > ceiling]
    return lines + (found or ["- none: every goal is within the ceilings measured beside it"])


def _verdict(value: float, goal: float) -> str:
    return "met" if value >= goal else f"short: {value / goal:.2f} of goal"


HEADER = ["figure (DESIGN §8)", "goal", "measured: median (min–max)", "ratio to the same run's ceiling", "verdict",
          "source, run"]


def plots(results: dict[str, Record], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    def series(ax: Any, xs: list[Any], summaries: list[Record], label: str) -> None:
        med = [s["median"] for s in summaries]
        err = [[m - s["min"] for m, s in zip(med, summaries)], [s["max"] - m for m, s in zip(med, summaries)]]
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)

    cache, direct = results.get("cache_tier"), results.get("direct_io")
    if cache or direct:
        for kinds, name, title in ((("hot_read", "cold_read"), "fig7.png", "Read (Fig. 7)"),
                                   (("write",), "fig8.png", "Write (Fig. 8)")):
            fig, ax = plt.subplots(figsize=(5.5, 3.8))
            if cache:
                threads = sorted(cache["cache"], key=int)
                for kind in kinds:
                    series(ax, [int(t) for t in threads], [cache["cache"][t][kind] for t in threads],
                           kind.replace("_", " ").replace("write", "cache write"))
            if direct:
                for backend, per in direct["backends"].items():
                    threads = sorted(per, key=int)
                    kind = "read" if "hot_read" in kinds else "write"
                    series(ax, [int(t) for t in threads], [per[t][kind] for t in threads], f"direct {kind} ({backend})")
            ax.set(xscale="log", xlabel="client threads", ylabel="MB/s", title=title)
            ax.set_xticks([1, 2, 4, 8, 16], labels=["1", "2", "4", "8", "16"])
            ax.legend(fontsize=8)
            save(fig, name)
    blaze = results.get("blaze")
    if blaze:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for mode, per in blaze["modes"].items():
            sizes = list(per["blaze"])
            best = [max(per["blaze"][s].values(), key=lambda v: v["median"]) for s in sizes]
            series(ax, sizes, best, f"NDBlaze, {mode}")
            ax.axhline(max(v["median"] for v in per["cache_write"].values()), ls=":", lw=1,
                       label=f"cache write, {mode}")
        ax.set(xlabel="blob size", ylabel="MB/s accepted", title="NDBlaze burst writes (Fig. 9)")
        ax.legend(fontsize=7)
        save(fig, "fig9.png")
    ingest, down = results.get("ingest"), results.get("downsample")
    if ingest or down:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        bars: list[tuple[str, Record]] = []
        if ingest:
            s = ingest["supercuboids"]
            bars += [("ingest, 1 worker", s["build_1"]), ("ingest, 2 workers (each)", s["build_2"]),
                     ("PNG decode ceiling", s["png_decode"])]
        if down:
            for data, kernel in down["kernel"].items():
                bars += [(f"downsample SQS\n{data}", down["engines"][data]["sqs"]), (f"reduce kernel\n{data}", kernel)]
        med = [b["median"] for _, b in bars]
        ax.bar(range(len(bars)), med, yerr=[[m - b["min"] for m, (_, b) in zip(med, bars)],
                                            [b["max"] - m for m, (_, b) in zip(med, bars)]], capsize=3)
        ax.set_xticks(range(len(bars)), labels=[n for n, _ in bars], rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="MB/s per worker / core", title="Ingest and downsampling (Fig. 10, local scale)")
        save(fig, "fig10.png")
    return made


def main() -> None:
    results = load()
    table = rows(results)
    md = ["# Summary: the DESIGN.md §8 figures", "",
          "From the latest run of each benchmark (`make bench`; `make bench-quick` marks its runs quick). "
          "Each ratio is to a ceiling measured in the same run on the same machine.", "",
          "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    md += ["| " + " | ".join(r) + " |" for r in table]
    md += ["", *why_short(table), "", *beyond_ceilings(results)]
    hardware = {name: rec["hardware"] for name, rec in results.items()}
    made = plots(results, RESULTS)
    md += ["", *[f"![{name}]({name})" for name in made]]
    md += ["", "Hardware of each run:", ""]
    md += [f"- `{name}`: {hw['cores']} cores, {hw['memory_mib']} MiB, {hw['cpu']}, Python {hw['python']}, "
           f"{hw.get('date', '?')}" for name, hw in hardware.items()]
    (RESULTS / "summary.md").write_text("\n".join(md) + "\n")
    (RESULTS / "summary.json").write_text(json.dumps({"header": HEADER, "rows": table, "hardware": hardware},
                                                     indent=1) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
