"""Both redis-servers of the live stack (the cache tier's and locks', the NDBlaze buffer's)
killed with SIGKILL while writes arrive, then started again with the same command line (AOF,
`appendfsync always`, the buffer's memory cap): the way a supervisor restarts them.

tests/engine/test_cache_faults.py and tests/blaze/test_blaze.py already show the AOF keeps
acknowledged writes across a SIGKILL, with fresh clients. Here the long-lived processes stay:
the gunicorn worker and the daemons must answer 503 (with a message) while Redis is away and
serve again once it is back, without a restart; every acknowledged write reads back; a write that
got no acknowledgement is whole or absent; the flusher writes everything back.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import redis

from ndstore.core.geometry import Box
from ndstore.ops.localstack import wait_until
from tests.faults.conftest import Channel, Stack, error_message, whole_or_nothing

pytestmark = pytest.mark.faults

FRAME = Box((0, 0, 0), (1024, 1024, 64))
OUTAGE_S = 1.5  # longer than a round of the flusher (0.2 s) and of the cache manager (1 s)
SLOT = (256, 256, 16)  # every write fills one slot of the frame: inside one supercuboid, disjoint


def slot(i: int) -> Box:
    x, y, z = (i % 4) * SLOT[0], (i // 4 % 4) * SLOT[1], (i // 16) * SLOT[2]
    return Box((x, y, z), (x + SLOT[0], y + SLOT[1], z + SLOT[2]))


def args(proc: subprocess.Popen[bytes]) -> list[str]:
    return [str(a) for a in proc.args] if isinstance(proc.args, list) else [str(proc.args)]


def kill(stack: Stack, port: int) -> subprocess.Popen[bytes]:
    """SIGKILL the stack's redis-server on `port`."""
    [proc] = [p for p in stack.local.procs if args(p)[0].endswith("redis-server") and str(port) in args(p)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc


def start_again(stack: Stack, old: subprocess.Popen[bytes], port: int) -> None:
    """Start a killed redis-server again with its command line: the same data and settings."""
    new = subprocess.Popen(old.args, stdout=subprocess.DEVNULL)
    stack.local.procs[stack.local.procs.index(old)] = new  # the stack's fixture stops this one
    wait_until(lambda: redis.Redis(port=port).ping(), f"redis-server on {port} again")


def test_the_live_stack_rides_out_both_redis_servers_killed_and_restarted(stack: Stack) -> None:
    cache = stack.channel("rk", FRAME.hi)
    buffered = stack.channel("rkb", FRAME.hi)
    workers, daemons = stack.web_workers(), [p.pid for p in stack.local.procs if "daemons" in args(p)]
    refs = {"cutout": np.zeros(FRAME.shape_zyx, np.uint8), "blaze/cutout": np.zeros(FRAME.shape_zyx, np.uint8)}
    unacknowledged: list[tuple[str, Box, np.ndarray]] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    killed = threading.Event()
    acked_at: dict[tuple[str, int], float] = {}
    killed_at = [0.0]

    def traffic(path: str, ch: Channel, offset: int) -> None:
        rng, session = np.random.default_rng(offset), stack.session()
        for i in range(offset, 64, 2):
            box, data = slot(i), rng.integers(1, 256, SLOT[::-1], dtype=np.uint8)
            r = ch.write(box, data, path, session=session)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 201:
                refs[path][box.slices_zyx()] = data
                acked_at[(path, i)] = time.monotonic()
            else:
                unacknowledged.append((path, box, data))
                if r.status_code != 503 or not error_message(r):
                    errors.append(f"{path} {box}: {r.status_code} {r.text}")
            if i > offset + 8 and not killed.is_set():
                killed.wait(30)  # a few acknowledged before the kill, then on through it

    threads = [threading.Thread(target=traffic, args=(path, ch, n))
               for n, (path, ch) in enumerate((("cutout", cache), ("blaze/cutout", buffered)))]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: statuses.get(201, 0) >= 8, "writes before the kill")
        ports = (stack.local.redis_port, stack.local.blaze_redis_port)
        dead = [kill(stack, port) for port in ports]
        down_since = killed_at[0] = time.monotonic()
        killed.set()
        wait_until(lambda: statuses.get(503, 0) >= 2, "503s while Redis is away")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_since)))  # the daemons' rounds meet it too
        for old, port in zip(dead, ports):
            start_again(stack, old, port)
    finally:
        killed.set()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert set(statuses) == {201, 503}, statuses

    # the same processes serve again: writes are acknowledged, nothing was restarted by hand
    assert cache.write(slot(63), np.full(SLOT[::-1], 7, np.uint8)).status_code == 201
    refs["cutout"][slot(63).slices_zyx()] = 7
    assert stack.web_workers() == workers
    assert [p.pid for p in stack.local.procs if "daemons" in args(p) and p.poll() is None] == daemons
    for path, ch in (("cutout", cache), ("blaze/cutout", buffered)):
        got = ch.read_ok(FRAME, path)
        for p, box, data in unacknowledged:
            if p == path:
                whole_or_nothing(got[box.slices_zyx()], refs[path][box.slices_zyx()], data, box)
                refs[path][box.slices_zyx()] = got[box.slices_zyx()]
        lost = [(i, acked_at.get((path, i), 0.0) - killed_at[0]) for i in range(64)
                if not np.array_equal(got[slot(i).slices_zyx()], refs[path][slot(i).slices_zyx()])]
        assert not lost, f"{path}: acknowledged writes lost (slot, acked s after the kill): {lost}"
    stack.wait_written_back()
    np.testing.assert_array_equal(cache.read_ok(FRAME, mode="raw"), refs["cutout"])
