"""The cache manager evicting under memory pressure during a write storm.

The stack's cache watermarks are 64/32 MiB; three client threads write incompressible data into
the same six supercuboids (each thread its own z slab of them, so their writes contend for the
same locks and the final state is known), about 150 MiB in all, and read back a box of their own
after every write. The cache manager evicts (writing back dirty supercuboids first) while they
write; the flusher writes back behind them. Every acknowledged write must read back exactly,
during the storm and after it, through the cache, direct I/O and the base tier as it is.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ndstore.core.geometry import Box
from tests.faults.conftest import Stack, random_box

pytestmark = pytest.mark.faults

FRAME = Box((0, 0, 0), (1536, 1024, 64))  # 3 x 2 supercuboids of uint8, 96 MiB
THREADS, WRITES = 3, 8


def test_every_acknowledged_write_reads_back_while_the_cache_manager_evicts(stack: Stack) -> None:
    ch = stack.channel("storm", FRAME.hi)
    ref = np.zeros(FRAME.shape_zyx, np.uint8)
    since = len(stack.proxy.seen)
    errors: list[str] = []
    peak = {"memory": 0}

    def storm(n: int) -> None:
        rng = np.random.default_rng(100 + n)
        slab = Box((0, 0, 20 * n), (FRAME.hi[0], FRAME.hi[1], 20 * n + 20))
        session = stack.session()
        written: list[Box] = []
        for _ in range(WRITES):
            box = random_box(rng, slab, (1100, 800, 20), least=(600, 500, 12))
            data = rng.integers(0, 256, box.shape_zyx, dtype=np.uint8)
            r = ch.write(box, data, session=session)
            if r.status_code != 201:
                errors.append(f"write {box}: {r.status_code} {r.text}")
                return
            ref[box.slices_zyx()] = data  # this thread's slab only: no other thread writes there
            written.append(box)
            check = written[int(rng.integers(0, len(written)))]
            status, got, message = ch.read(check, session=session)
            if got is None or not np.array_equal(got, ref[check.slices_zyx()]):
                errors.append(f"read {check} after writes: {status} {message}")
                return
            peak["memory"] = max(peak["memory"], int(stack.redis().info("memory")["used_memory"]))

    threads = [threading.Thread(target=storm, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    high = int(stack.env["NDSTORE_CACHE_HIGH_BYTES"])
    assert peak["memory"] > high  # the storm did push the cache past its high watermark
    bucket = f"/{stack.env['NDSTORE_S3_BUCKET']}/"
    refetched = [s for s in stack.proxy.seen[since:]  # 206: a part of an object (ndstore/storage/s3.py)
                 if s.call.method == "GET" and s.call.path.startswith(bucket) and s.status in (200, 206)]
    assert refetched  # supercuboids written back, evicted, and paged in again
    stack.wait_written_back()
    np.testing.assert_array_equal(ch.read_ok(FRAME), ref)
    np.testing.assert_array_equal(ch.read_ok(FRAME, "direct/cutout"), ref)
    np.testing.assert_array_equal(ch.read_ok(FRAME, mode="raw"), ref)
