"""The reliability figures of DESIGN.md §8 / issue 10: fault scenarios and fuzz cases run, each
with zero lost writes and no 500, counted from a real run of tests/faults and tests/fuzz.

    python -m benchmarks.bench_reliability [--quick] [--scale N]

Runs pytest over tests/faults (the live stack with its fault-injecting proxy) and tests/fuzz
(schemathesis over the OpenAPI schema, hypothesis over the body decoders, hostile writes and
names) with NDSTORE_FUZZ_SCALE=N (3 by default: three times the examples of `make test`; 1 with
--quick). A fault scenario is one test item: it passes only if every acknowledged write reads
back and no read is torn or stale. Strict xfails are the documented, known exceptions
(tests/faults/README.md). The load-minutes come from bench_load (results/load.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, hardware, write_results

ROOT = Path(__file__).resolve().parents[1]
HEADER = ["suite", "items run", "passed", "known exceptions (strict xfail)", "failed", "cases", "seconds"]


def outcomes(junit: Path, prefix: str) -> list[dict[str, Any]]:
    """Each test item under ``prefix`` with its outcome: passed, xfailed, skipped or failed."""
    items = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname = case.get("classname", "")
        if not classname.startswith(prefix):
            continue
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        items.append({"test": f"{classname}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time", 0)), 1)})
    return items


def count(items: list[dict[str, Any]], outcome: str) -> int:
    return sum(item["outcome"] == outcome for item in items)


def run(scale: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        junit, fuzz = Path(tmp) / "junit.xml", Path(tmp) / "fuzz.json"
        env = {**os.environ, "NDSTORE_FUZZ_SCALE": str(scale), "NDSTORE_FUZZ_REPORT": str(fuzz)}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "tests/faults", "tests/fuzz", "-q",
                               "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=ROOT, env=env)
        wall = time.monotonic() - start
        if not junit.exists():
            raise SystemExit(f"pytest wrote no report (exit {done.returncode})")
        faults, fuzz_items = outcomes(junit, "tests.faults"), outcomes(junit, "tests.fuzz")
        fuzz_report = json.loads(fuzz.read_text()) if fuzz.exists() else {}
    return {"scale": scale, "pytest_exit": done.returncode, "wall_seconds": round(wall, 1),
            "faults": {"items": faults, "scenarios": len(faults), "passed": count(faults, "passed"),
                       "xfailed": count(faults, "xfailed"), "failed": count(faults, "failed"),
                       "seconds": round(sum(i["seconds"] for i in faults), 1)},
            "fuzz": {"items": fuzz_items, "tests": len(fuzz_items), "passed": count(fuzz_items, "passed"),
                     "xfailed": count(fuzz_items, "xfailed"), "failed": count(fuzz_items, "failed"),
                     "cases": fuzz_report.get("cases", 0),
                     "modules": {name: {k: m[k] for k in ("tests", "cases", "failures")}
                                 for name, m in fuzz_report.get("modules", {}).items()},
                     "seconds": round(sum(i["seconds"] for i in fuzz_items), 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the test suite's example counts (scale 1)")
    parser.add_argument("--scale", type=float, default=None, help="NDSTORE_FUZZ_SCALE (default 3; 1 with --quick)")
    args = parser.parse_args()
    scale = args.scale or (1.0 if args.quick else 3.0)
    record: dict[str, Any] = {"hardware": hardware(), "quick": args.quick, **run(scale)}
    load = RESULTS / "load.json"
    record["load_minutes"] = json.loads(load.read_text())["load_minutes"] if load.exists() else None
    f, z = record["faults"], record["fuzz"]
    table = [["fault scenarios (tests/faults)", str(f["scenarios"]), str(f["passed"]), str(f["xfailed"]),
              str(f["failed"]), "", f"{f['seconds']:.0f}"],
             ["fuzz (tests/fuzz)", str(z["tests"]), str(z["passed"]), str(z["xfailed"]), str(z["failed"]),
              str(z["cases"]), f"{z['seconds']:.0f}"]]
    extra = "\n".join(f"- `{i['test']}`: {i['outcome']}" for i in f["items"] + z["items"]
                      if i["outcome"] != "passed")
    print(write_results("reliability", record, table, HEADER,
                        f"NDSTORE_FUZZ_SCALE={scale:g}; pytest exit {record['pytest_exit']}.\n\n"
                        f"Items not passed:\n\n{extra or '- none'}",
                        units="Counts from one run of `pytest tests/faults tests/fuzz`."))
    if f["failed"] or z["failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
