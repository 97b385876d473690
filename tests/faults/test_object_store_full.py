"""The base tier (the file object store, `NDSTORE_OBJECT_STORE=file`) full or read-only under a
live stack, then grown or made writable again without restarting anything.

The objects directory (`<data dir>/objects`) is a small tmpfs mounted before the stack starts; the
SQLite index, the metadata database and both redis-servers stay on the normal disk. A filler file
takes every free byte of the tmpfs (a full disk), or the tmpfs is remounted read-only.
Meanwhile: a direct write answers 507 (full) or 503 (read-only), JSON with a message and
Retry-After, and changes nothing; a cache-tier write is acknowledged (201: it lands in Redis) and
reads back through the cache; the flusher keeps trying and failing (its supercuboids stay dirty,
raw reads show the old data; its rounds fail too, as the cache Redis's ledger is an object of the
same store, and back off up to 30 s) and the daemons stay alive. Once the filler is deleted or the tmpfs
is writable again, the flusher writes everything back by itself: raw, direct and cache reads
equal the reference of every acknowledged write, and no temporary file is left behind. No answer
in the module is a 500 or an HTML page.

Needs root (mount). Everything binds 127.0.0.1.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import requests

from ndstore.core.errors import StorageFull
from ndstore.core.geometry import Box
from ndstore.ops.localstack import LocalStack, free_port
from ndstore.storage.redis_metrics import RedisMetrics, labels_of
from tests.conftest import own_stack_env
from tests.faults.conftest import LEASE_MS, TOKEN, Channel, Stack, error_message, wait_for

pytestmark = pytest.mark.faults

TMPFS_BYTES = 8 << 20
FRAME = Box((0, 0, 0), (1024, 1024, 64))  # 2 x 2 x 1 supercuboids of 512 x 512 x 64 (uint8)
CUBOID = (128, 128, 16)  # one cuboid of random uint8: an object grows by 256 KiB per cuboid
STUCK_S = 2.0  # several rounds of the flusher (every 0.2 s; once its rounds fail, after 0.4 s, 0.8 s, ...)
WRITE_BACK_S = 60.0  # past the daemons' longest backoff (30 s)
Array = npt.NDArray[Any]


def cuboid(sx: int, sy: int, n: int) -> Box:
    """The n-th cuboid (x first) of supercuboid (sx, sy): aligned, one cuboid blob each."""
    x = sx * 512 + (n % 4) * CUBOID[0]
    y = sy * 512 + (n // 4 % 4) * CUBOID[1]
    z = (n // 16) * CUBOID[2]
    return Box((x, y, z), (x + CUBOID[0], y + CUBOID[1], z + CUBOID[2]))


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def remount(target: Path, mode: str) -> None:
    """`mount -o remount,<mode>`; a remount read-only is refused (EBUSY) while a file there is
    open for writing (a flush under way), so it is tried again for a while."""
    deadline = time.monotonic() + 30
    while True:
        try:
            _mount("-o", f"remount,{mode}", str(target))
            return
        except subprocess.CalledProcessError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"remount,{mode} of {target}: {exc.stderr.decode().strip()}") from exc
            time.sleep(0.1)


def _unmount(target: Path) -> None:
    if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(target)], check=True, capture_output=True)


class Recorder:
    """Every answer the tests get (through `session()`): none may be a 500 or an HTML page."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, str, int, str]] = []

    def hook(self, r: requests.Response, *_args: Any, **_kwargs: Any) -> requests.Response:
        self.answers.append((r.request.method or "", r.url, r.status_code, r.headers.get("Content-Type", "")))
        return r

    def bad(self) -> list[tuple[str, str, int, str]]:
        return [a for a in self.answers if a[2] == 500 or "html" in a[3].lower()]


class Live:
    def __init__(self, stack: Stack, objects: Path):
        self.stack = stack
        self.objects = objects
        self.recorder = Recorder()

    def session(self) -> requests.Session:
        s = self.stack.session()
        s.hooks["response"].append(self.recorder.hook)
        return s

    def daemons(self) -> list[int]:
        return [p.pid for p in self.stack.local.procs if "daemons" in (p.args if isinstance(p.args, list) else [])
                and p.poll() is None]

    def dirty(self) -> int:
        return int(self.stack.redis().zcard("ndc:dirty"))

    def postponed(self, kind: str) -> float:
        """Write-backs the flusher tried and postponed (`flushes_postponed_total{kind}`), as far as
        every process has added them into the shared counters (each second)."""
        counters = RedisMetrics(self.stack.redis()).snapshot().counters
        return sum(v for (name, labels), v in counters.items()
                   if name == "flushes_postponed_total" and labels_of(labels).get("kind") == kind)

    def leftovers(self) -> list[str]:
        return sorted(str(p.relative_to(self.objects)) for p in self.objects.rglob(".tmp-*"))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data_dir = tmp_path_factory.mktemp("object-store-full")
    objects = data_dir / "objects"
    objects.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0755", "tmpfs", str(objects))
    try:
        env = {
            "NDSTORE_ADMIN_TOKEN": TOKEN, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.base",
            "NDSTORE_OBJECT_STORE": "file", "NDSTORE_INDEX": "sqlite", "NDSTORE_LOCKS": "redis",
            "NDSTORE_LOCK_LEASE_MS": str(LEASE_MS), "NDSTORE_FLUSH_AGE_S": "0.2", "NDSTORE_FLUSH_INTERVAL_S": "0.2",
            "NDSTORE_INGEST_WORKERS": "1", "GUNICORN_CMD_ARGS": "--log-level warning",
        }
        local = LocalStack(data_dir, port=free_port(), workers=1, threads=4, extra_env=own_stack_env(env),
                           with_merger=False, with_runner=False)
        local.start()
        try:
            # no moto, no proxy: this stack's base tier is the directory on the tmpfs
            yield Live(Stack(local, None, env), objects)  # type: ignore[arg-type]
        finally:
            local.stop()
    finally:
        _unmount(objects)


def read_ok(ch: Channel, box: Box, session: requests.Session, path: str = "cutout",
            mode: str | None = None) -> Array:
    status, data, message = ch.read(box, path, mode, session=session)
    assert status == 200 and data is not None, (path, mode, status, message)
    return data


def assert_all_reads(ch: Channel, ref: Array, session: requests.Session) -> None:
    """Raw (the base tier as it is), direct and cache reads of the frame all equal `ref`."""
    for path, mode in (("cutout", "raw"), ("direct/cutout", None), ("cutout", None)):
        got = read_ok(ch, FRAME, session, path, mode)
        diff = int(np.count_nonzero(got != ref))
        assert diff == 0, f"{path} {mode or 'cache'}: {diff} voxels differ from the reference"


def assert_refusal(r: requests.Response, status: int, words: str) -> None:
    """A refused write: `status`, the service's JSON error body naming the problem, Retry-After
    (a full store: StorageFull's 30 s; it is not freed in a second)."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    message = error_message(r)
    assert words in message, message
    retry_after = r.headers.get("Retry-After")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, r.headers
    if status == 507:
        assert int(retry_after) == StorageFull.retry_after_s, r.headers


def random_cuboid(rng: np.random.Generator) -> Array:
    return rng.integers(1, 256, CUBOID[::-1], dtype=np.uint8)


def fill(path: Path) -> int:
    """Write `path` until the file system says ENOSPC; its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block = b"\xff" * (64 << 10)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path.stat().st_size


def outage(live: Live, ch: Channel, ref: Array, stored: Array, stuck_kind: str,
           direct_status: int, direct_words: str, rng: np.random.Generator, session: requests.Session) -> list[Box]:
    """What both faults must do while they last: direct writes refused (changing nothing), cache
    writes acknowledged and read back, the flusher trying in vain, the daemons alive. Returns the
    boxes of the refused direct writes; `ref` is updated with every acknowledged write."""
    daemons = live.daemons()
    refused = [cuboid(0, 0, 1), cuboid(0, 1, 0)]  # into a stored supercuboid, into a new one
    for box in refused:
        r = ch.write(box, random_cuboid(rng), "direct/cutout", session=session)
        assert_refusal(r, direct_status, direct_words)
    np.testing.assert_array_equal(read_ok(ch, FRAME, session, mode="raw"), stored)  # the refusals changed nothing

    before = live.postponed(stuck_kind)
    # into a resident supercuboid, a new one, one the refused direct write dropped from the cache
    # (paged in from the failing store), and an overwrite
    acknowledged = [cuboid(1, 0, 1), cuboid(1, 1, 0), cuboid(0, 0, 2), cuboid(1, 0, 0)]
    for box in acknowledged:
        data = random_cuboid(rng)
        r = ch.write(box, data, session=session)
        assert r.status_code == 201, (r.status_code, r.text[:500])
        ref[box.slices_zyx()] = data
    part = Box((600, 40, 3), (700, 90, 30))  # partly covers cuboids of supercuboid (1, 0): a merge
    ref[part.slices_zyx()] = rng.integers(1, 256, part.shape_zyx, dtype=np.uint8)
    assert ch.write(part, ref[part.slices_zyx()], session=session).status_code == 201
    np.testing.assert_array_equal(read_ok(ch, FRAME, session), ref)  # read your writes, through the cache

    # the flusher keeps meeting the fault: nothing is written back, its supercuboids stay dirty
    for _ in range(int(STUCK_S / 0.25)):
        time.sleep(0.25)
        assert live.dirty() == 3, "dirty supercuboids written back (or dropped) while the store cannot take them"
    np.testing.assert_array_equal(read_ok(ch, FRAME, session, mode="raw"), stored)
    # (its rounds fail too, as the ledger cannot be written: they back off, 0.4 s, 0.8 s, ...)
    wait_for(lambda: live.postponed(stuck_kind) >= before + 6, f"the flusher trying again ({stuck_kind})", 30)
    # a direct read must show every acknowledged write: it writes the dirty copies back first,
    # which it cannot now; it may refuse, never answer the stale base tier
    status, got, message = ch.read(FRAME, "direct/cutout", session=session)
    assert status == direct_status or (status == 200 and got is not None and np.array_equal(got, ref)), \
        (status, message)
    assert live.daemons() == daemons, "the daemons died or were restarted"
    return refused


def recovered(live: Live, ch: Channel, ref: Array, refused: list[Box], since: float, rng: np.random.Generator,
              session: requests.Session) -> float:
    """After the fault, with nothing restarted: everything is written back by the flusher alone;
    the refused direct writes succeed when sent again. Returns how long the write-back took."""
    daemons = live.daemons()
    wait_for(lambda: live.dirty() == 0, "the write-back of every dirty supercuboid", WRITE_BACK_S, 0.1)
    took = time.monotonic() - since
    assert_all_reads(ch, ref, session)
    for box in refused:
        data = random_cuboid(rng)
        r = ch.write(box, data, "direct/cutout", session=session)
        assert r.status_code == 201, (r.status_code, r.text[:500])
        ref[box.slices_zyx()] = data
    assert_all_reads(ch, ref, session)
    assert live.daemons() == daemons
    assert not live.leftovers(), f"temporary files left in the object store: {live.leftovers()}"
    assert not live.recorder.bad(), live.recorder.bad()
    return took


def baseline(live: Live, ch: Channel, rng: np.random.Generator, session: requests.Session) -> Array:
    """A direct write and a written-back cache write before the fault: the data that is stored."""
    ref = np.zeros(FRAME.shape_zyx, np.uint8)
    for box, path in ((cuboid(0, 0, 0), "direct/cutout"), (cuboid(1, 0, 0), "cutout")):
        data = random_cuboid(rng)
        r = ch.write(box, data, path, session=session)
        assert r.status_code == 201, (r.status_code, r.text[:500])
        ref[box.slices_zyx()] = data
    live.stack.wait_written_back()
    assert_all_reads(ch, ref, session)
    return ref


def test_a_full_object_store_refuses_direct_writes_with_507_and_the_flusher_resumes_once_there_is_room(
        live: Live) -> None:
    rng, session = np.random.default_rng(1), live.session()
    ch = live.stack.channel("osfull", FRAME.hi)
    ref = baseline(live, ch, rng, session)
    stored = ref.copy()

    filler = live.objects / "filler"
    try:
        size = fill(filler)
        free = os.statvfs(live.objects)
        assert free.f_bavail * free.f_frsize < CUBOID[0] * CUBOID[1] * CUBOID[2], "the tmpfs is not full"
        print(f"filler {size} bytes; free {free.f_bavail * free.f_frsize} bytes")
        health = requests.get(f"{live.stack.url}/healthz", timeout=30)
        print(f"/healthz while full: {health.status_code} {health.text}")
        refused = outage(live, ch, ref, stored, "StorageFull", 507, "full", rng, session)
    finally:
        freed_at = time.monotonic()
        filler.unlink(missing_ok=True)
    took = recovered(live, ch, ref, refused, freed_at, rng, session)
    print(f"written back {took:.1f}s after the filler was deleted")


def test_a_read_only_object_store_refuses_direct_writes_with_503_and_the_flusher_resumes_once_writable(
        live: Live) -> None:
    rng, session = np.random.default_rng(2), live.session()
    ch = live.stack.channel("osro", FRAME.hi)
    ref = baseline(live, ch, rng, session)
    stored = ref.copy()

    remount(live.objects, "ro")
    try:
        probe = live.objects / "probe"
        with pytest.raises(OSError) as raised:
            probe.touch()
        assert raised.value.errno == errno.EROFS
        health = requests.get(f"{live.stack.url}/healthz", timeout=30)
        print(f"/healthz while read-only: {health.status_code} {health.text}")
        refused = outage(live, ch, ref, stored, "StorageError", 503, "read-only", rng, session)
    finally:
        writable_at = time.monotonic()
        remount(live.objects, "rw")
    took = recovered(live, ch, ref, refused, writable_at, rng, session)
    print(f"written back {took:.1f}s after the remount read-write")
