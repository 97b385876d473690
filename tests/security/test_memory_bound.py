"""The largest allowed requests, many at once, anonymous and authenticated (cutout reads and a
write, ids, a windowed slice), keep a web worker under its documented memory bound, measured by
its peak RSS (VmHWM): the budget of bytes in flight plus what glibc keeps of freed memory
(MALLOC_TRIM_THRESHOLD_ + MALLOC_TOP_PAD_, as `ndstore up` sets them). Before the budget, four
1 GiB cutouts took one worker to 6 GiB; here eight 64 MiB reads at once would need over 1 GiB."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from ndstore.ops.localstack import MALLOC_TUNING, LocalStack, free_port
from tests.security.conftest import admin_session, public_dataset

MiB = 1 << 20
MAX_CUTOUT = 64 * MiB
BUDGET = 4 * MAX_CUTOUT  # the default: room for the largest write
RETAINED = int(MALLOC_TUNING["MALLOC_TRIM_THRESHOLD_"]) + int(MALLOC_TUNING["MALLOC_TOP_PAD_"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    local = LocalStack(tmp_path_factory.mktemp("memory-bound"), port=free_port(), workers=1, threads=8,
                       with_merger=False, extra_env={
                           "NDSTORE_MAX_CUTOUT_BYTES": str(MAX_CUTOUT), "NDSTORE_MAX_BODY_BYTES": str(MAX_CUTOUT),
                           "NDSTORE_ANON_BYTES_IN_FLIGHT": str(128 * MiB), "NDSTORE_ANON_READ_RATE": "0"})
    local.start()
    try:
        yield local
    finally:
        local.stop()


def _worker(stack: LocalStack) -> int:
    [master] = [p.pid for p in stack.procs if "gunicorn" in " ".join(map(str, p.args))]
    [pid] = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return int(pid)


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def test_the_largest_requests_at_once_stay_under_the_bound(stack: LocalStack) -> None:
    s = admin_session(stack.data_dir)
    url = f"{stack.url}/v1"
    public_dataset(s, stack.url, "mem", (1024, 1024, 64),
                   {"img": {"datatype": "uint8"}, "ann": {"datatype": "uint64", "type": "annotation"}})
    raw = {"Accept": "application/octet-stream"}
    img, ann = f"{url}/cutout/mem/e/img/0", f"{url}/cutout/mem/e/ann/0"
    assert s.get(f"{img}/0:64/0:64/0:8/", headers=raw, timeout=10).status_code == 200  # everything imported
    worker = _worker(stack)
    baseline = _peak_rss(worker)

    data = np.random.default_rng(0).integers(0, 255, (64, 1024, 1024), dtype=np.uint8)
    labels = np.random.default_rng(1).integers(0, 1 << 40, (8, 1024, 1024), dtype=np.uint64)
    assert s.post(f"{ann}/0:1024/0:1024/0:8/", data=labels.tobytes(), timeout=120,
                  headers={"Content-Type": "application/octet-stream"}).status_code == 201
    calls = [
        *[lambda: s.post(f"{img}/0:1024/0:1024/0:64/", data=data.tobytes(), timeout=120,
                         headers={"Content-Type": "application/octet-stream"})] * 2,
        *[lambda: s.get(f"{img}/0:1024/0:1024/0:64/", headers=raw, timeout=120)] * 8,
        *[lambda: requests.get(f"{img}/0:1024/0:1024/0:32/", headers=raw, timeout=120)] * 8,  # anonymous
        *[lambda: s.get(f"{url}/ids/mem/e/ann/0/0:1024/0:1024/0:8/", timeout=120)] * 2,
        *[lambda: requests.get(f"{url}/image/mem/e/img/xy/0/0:1024/0:1024/3/?window=10,200", timeout=120)] * 4,
    ]
    codes: list[int] = []

    def call(fn: object) -> None:
        codes.append(fn().status_code)  # type: ignore[operator]

    threads = [threading.Thread(target=call, args=(fn,)) for fn in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {200, 201, 503}, codes
    assert 503 in codes and codes.count(200) >= 4  # the budget refused some, the rest were served
    grown = _peak_rss(worker) - baseline
    assert grown <= BUDGET + RETAINED, f"peak RSS grew {grown >> 20} MiB, bound {(BUDGET + RETAINED) >> 20} MiB"
