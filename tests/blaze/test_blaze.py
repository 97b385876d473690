"""NDBlaze on real Redis servers and a file-store base tier: buffered writes, consistent reads
before the merge, the merge itself, back-pressure, writes during a merge, and a crash mid-merge."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from ndstore.core import wire
from ndstore.core.errors import BufferFull, InvalidBody
from ndstore.core.geometry import Box
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.blaze_buffer import PART_BYTES
from tests.blaze.conftest import Blaze, make_blaze
from tests.engine.conftest import small_channel

FORMATS = list(wire.FORMATS)


@dataclass
class Write:
    seq: int
    cutout: Cutout
    data: np.ndarray


def random_box(rng: random.Random, frame: Box, max_side: tuple[int, int, int] = (200, 200, 24)) -> Box:
    lo = tuple(rng.randrange(frame.lo[i], frame.hi[i] - 1) for i in range(3))
    hi = tuple(min(frame.hi[i], lo[i] + rng.randrange(1, max_side[i] + 1)) for i in range(3))
    return Box(lo, hi)  # type: ignore[arg-type]


def write_random(blaze: Blaze, channel: ChannelVolume, rng: random.Random, count: int) -> list[Write]:
    """``count`` small random overlapping writes in every media type; returns them with their seqs."""
    done = []
    for _ in range(count):
        cutout = Cutout(channel, 0, random_box(rng, channel.frame), range(1))
        data = np.random.default_rng(rng.randrange(1 << 30)).integers(
            1, 250, cutout.shape, dtype=np.uint64).astype(channel.dtype)
        fmt = wire.FORMATS[rng.choice(FORMATS)]
        has_time = rng.random() < 0.5
        body = fmt.encode(data if has_time else data[0])
        done.append(Write(blaze.tier.write_body(cutout, body, fmt.media_type, has_time), cutout, data))
    return done


def reference(channel: ChannelVolume, base: np.ndarray, writes: list[Write]) -> np.ndarray:
    ref = base.copy()
    for w in sorted(writes, key=lambda w: w.seq):
        ref[w.cutout.box.slices_zyx(channel.frame.lo)] = w.data[0]
    return ref


def whole(channel: ChannelVolume) -> Cutout:
    return Cutout(channel, 0, channel.frame, range(1))


def seed_base(blaze: Blaze, channel: ChannelVolume) -> np.ndarray:
    """Some data already stored, so merges read-modify-write real supercuboids."""
    base = np.zeros(whole(channel).shape[1:], channel.dtype)
    box = Box((100, 100, 4), (700, 600, 40))
    base[box.slices_zyx()] = 7
    blaze.base.write(Cutout(channel, 0, box, range(1)), base[np.newaxis][(slice(None), *box.slices_zyx())])
    return base


def test_concurrent_writes_read_before_merge_and_merged_equal_reference(blaze: Blaze) -> None:
    channel = small_channel("uint8")
    base = seed_base(blaze, channel)
    results: list[list[Write]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=lambda i=i: results[i].extend(write_random(blaze, channel,
                                                                                  random.Random(i), 25)))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writes = [w for r in results for w in r]
    assert len({w.seq for w in writes}) == 100
    ref = reference(channel, base, writes)

    assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)  # consistent before the merge
    rng = random.Random(99)
    for _ in range(5):
        box = random_box(rng, channel.frame, (400, 400, 60))
        got = blaze.tier.read(Cutout(channel, 0, box, range(1)))[0]
        assert np.array_equal(got, ref[box.slices_zyx()])
    assert not np.array_equal(blaze.base.read(whole(channel))[0], ref)  # nothing merged yet

    result = blaze.merger.merge(blaze.buffer.pending_names())
    assert result.blobs_applied >= 100 and result.supercuboids_failed == 0
    assert np.array_equal(blaze.base.read(whole(channel))[0], ref)
    stats = blaze.buffer.stats()
    assert (stats.pending_bytes, stats.blobs, stats.supercuboids) == (0, 0, 0)
    assert not list(blaze.buffer.client.scan_iter("blz:blob:*"))


def test_a_body_larger_than_a_redis_part_round_trips(blaze: Blaze) -> None:
    channel = small_channel("uint8")
    cutout = whole(channel)
    assert cutout.nbytes > PART_BYTES
    data = np.random.default_rng(1).integers(0, 255, cutout.shape, dtype=np.uint8)
    blaze.tier.write_body(cutout, data.tobytes(), "application/octet-stream", True)
    assert np.array_equal(blaze.tier.read(cutout), data)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(blaze.base.read(cutout), data)


def test_time_series_writes_touch_only_their_time_samples(blaze: Blaze) -> None:
    probe = small_channel("uint16")
    channel = ChannelVolume(1, 1, 5, probe.dtype, probe.frame, 1, "anisotropic", 3)
    cutout = Cutout(channel, 0, Box((10, 20, 3), (90, 70, 9)), range(1, 3))
    data = np.arange(np.prod(cutout.shape), dtype=np.uint16).reshape(cutout.shape) + 1
    blaze.tier.write_body(cutout, wire.FORMATS["application/blosc"].encode(data), "application/blosc", True)
    all_times = Cutout(channel, 0, cutout.box, range(3))
    got = blaze.tier.read(all_times)
    assert not got[0].any() and np.array_equal(got[1:], data)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(blaze.base.read(all_times)[1:], data)
    assert not blaze.base.read(all_times)[0].any()


def test_framing_errors_are_refused_and_store_nothing(blaze: Blaze) -> None:
    channel = small_channel("uint16")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (64, 64, 4)), range(1))
    wrong = wire.FORMATS["application/blosc"].encode(np.ones((4, 64, 63), np.uint16))
    with pytest.raises(InvalidBody, match="needs"):
        blaze.tier.write_body(cutout, wrong, "application/blosc", False)
    with pytest.raises(InvalidBody, match="needs"):
        blaze.tier.write_body(cutout, b"\0" * 10, "application/octet-stream", False)
    with pytest.raises(InvalidBody, match="zlib"):
        blaze.tier.write_body(cutout, b"not gzip", "application/npygz", False)
    assert blaze.buffer.stats().blobs == 0


def test_a_body_that_would_not_decode_is_refused_not_acknowledged(blaze: Blaze) -> None:
    """201 means it will be applied: a body is decoded in full before it is acknowledged."""
    channel = small_channel("uint16")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (64, 64, 4)), range(1))
    with pytest.raises(InvalidBody):
        blaze.tier.write_body(cutout, b"\x78\x9c" + b"garbage!", "application/npygz", True)  # a zlib header only
    assert blaze.buffer.stats().blobs == 0


def test_a_blob_corrupted_in_the_buffer_is_never_skipped(blaze: Blaze) -> None:
    """A blob that no longer decodes (the buffer's Redis corrupted it) is not dropped: reads of it
    and merges of its supercuboid stop with DataCorrupt, it stays pending, the rest merges."""
    from ndstore.core.errors import DataCorrupt
    from ndstore.storage.blaze_buffer import blob_key

    channel = small_channel("uint16")
    sc = channel.grid(0).supercuboid
    here = Cutout(channel, 0, Box((0, 0, 0), (64, 64, 4)), range(1))
    elsewhere = Cutout(channel, 0, Box((sc[0], 0, 0), (sc[0] + 64, 64, 4)), range(1))  # another supercuboid
    blaze.tier.write(here, np.full(here.shape, 9, np.uint16))
    blaze.tier.write(elsewhere, np.full(elsewhere.shape, 5, np.uint16))
    key = f"{blob_key(1)}:0"
    blaze.buffer.client.set(key, bytes(blaze.buffer.client.get(key) or b"")[:-8])  # write 1's body, cut short
    with pytest.raises(DataCorrupt, match="write 1"):
        blaze.tier.read(here)
    result = blaze.merger.merge(blaze.buffer.pending_names())
    assert (result.supercuboids, result.supercuboids_failed) == (1, 1)
    assert np.array_equal(blaze.base.read(elsewhere), np.full(elsewhere.shape, 5, np.uint16))
    assert blaze.buffer.stats().blobs == 1 and len(blaze.buffer.pending_names()) == 1


def test_back_pressure_refuses_whole_writes_past_the_limit(tmp_path: Any, redis_url: str,
                                                           blaze_redis_url: str) -> None:
    import redis

    for url in (redis_url, blaze_redis_url):  # the cache's Redis too: it records the buffer's writes
        redis.Redis.from_url(url).flushdb()
    blaze = make_blaze(tmp_path, redis_url, blaze_redis_url, max_pending_bytes=200_000)
    channel = small_channel("uint8")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (100, 100, 8)), range(1))
    body = np.full(cutout.shape, 3, np.uint8).tobytes()  # 80,000 bytes
    blaze.tier.write_body(cutout, body, "application/octet-stream", True)
    blaze.tier.write_body(cutout, body, "application/octet-stream", True)
    with pytest.raises(BufferFull) as refused:
        blaze.tier.write_body(cutout, body, "application/octet-stream", True)
    assert refused.value.retry_after_s > 0
    stats = blaze.buffer.stats()
    assert (stats.blobs, stats.pending_bytes) == (2, 160_000)
    assert not list(blaze.buffer.client.scan_iter("blz:new:*"))  # the refused body is not kept
    blaze.merger.merge(blaze.buffer.pending_names())
    blaze.tier.write_body(cutout, body, "application/octet-stream", True)  # drained: accepted again


def test_writes_arriving_during_a_merge_are_kept_for_the_next(blaze: Blaze) -> None:
    channel = small_channel("uint8")
    base = seed_base(blaze, channel)
    writes = write_random(blaze, channel, random.Random(5), 30)
    stop = threading.Event()
    during: list[Write] = []

    def keep_writing() -> None:
        rng = random.Random(6)
        while not stop.is_set():
            during.extend(write_random(blaze, channel, rng, 1))

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        blaze.merger.merge(blaze.buffer.pending_names())
    finally:
        stop.set()
        writer.join()
    assert during, "no write arrived during the merge"
    all_writes = writes + during
    ref = reference(channel, base, all_writes)
    assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(blaze.base.read(whole(channel))[0], ref)
    assert blaze.buffer.stats().blobs == 0


class CrashingRelease:
    """The buffer, except that the n-th release raises: a merger that dies after storing a
    supercuboid and before releasing its blobs."""

    def __init__(self, buffer: Any, n: int):
        self._buffer, self._left = buffer, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)

    def release(self, name: str, seqs: Any) -> int:
        self._left -= 1
        if self._left == 0:
            raise ConnectionError("merger died")
        return int(self._buffer.release(name, seqs))


def test_a_merge_that_dies_between_store_and_release_reruns_to_the_same_result(blaze: Blaze) -> None:
    channel = small_channel("uint8")
    base = seed_base(blaze, channel)
    ref = reference(channel, base, write_random(blaze, channel, random.Random(11), 40))
    names = blaze.buffer.pending_names()
    assert len(names) >= 4
    real = blaze.merger.buffer
    blaze.merger.buffer = CrashingRelease(real, 3)  # type: ignore[assignment]
    with pytest.raises(ConnectionError):
        blaze.merger.merge(names)
    blaze.merger.buffer = real
    assert len(blaze.buffer.pending_names()) == len(names) - 2  # two merged, the third stored only
    assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(blaze.base.read(whole(channel))[0], ref)
    assert blaze.buffer.stats().blobs == 0


def test_merge_drops_stale_cached_copies_and_keeps_dirty_cache_writes(blaze: Blaze) -> None:
    channel = small_channel("uint16")
    tier = blaze.cache_tier
    box = Box((0, 0, 0), (300, 300, 10))
    first = np.full((1, *box.shape_zyx), 5, np.uint16)
    tier.write(Cutout(channel, 0, box, range(1)), first)  # dirty in the cache, not yet in the base
    small = Cutout(channel, 0, Box((10, 10, 2), (20, 20, 4)), range(1))
    blaze.tier.write(small, np.full(small.shape, 8, np.uint16))
    blaze.merger.merge(blaze.buffer.pending_names())
    expected = first.copy()
    expected[0][small.box.slices_zyx()] = 8
    assert np.array_equal(tier.read(Cutout(channel, 0, box, range(1))), expected)  # through the cache
    assert np.array_equal(blaze.base.read(Cutout(channel, 0, box, range(1))), expected)


def test_a_read_during_a_merge_round_applies_a_blob_only_where_it_is_still_pending(blaze: Blaze) -> None:
    """Blob X spans supercuboids A and B; newer blob Y lies in B over X. After B alone is merged
    (a round half way), X is pending in A only: a read must not re-apply X over Y in B."""
    channel = small_channel("uint8")
    sc = channel.grid(0).supercuboid
    x_box = Box((sc[0] - 32, 0, 0), (sc[0] + 32, 32, 4))  # across the x boundary of A and B
    y_box = Box((sc[0], 0, 0), (sc[0] + 16, 16, 4))  # inside B, over X
    writes = []
    for box, value in ((x_box, 3), (y_box, 9)):
        cutout = Cutout(channel, 0, box, range(1))
        data = np.full(cutout.shape, value, np.uint8)
        writes.append(Write(blaze.tier.write_body(cutout, data.tobytes(), "application/octet-stream", True),
                            cutout, data))
    ref = reference(channel, np.zeros(whole(channel).shape[1:], np.uint8), writes)
    b = next(n for n in blaze.buffer.pending_names() if blaze.buffer.pending_seqs([n])[n] == [w.seq for w in writes])
    blaze.merger.merge_one(b)
    assert len(blaze.buffer.pending_names()) == 1  # X still pending in A
    assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(blaze.base.read(whole(channel))[0], ref)


def test_the_merger_daemon_runs_rounds_on_age_backlog_and_request(blaze: Blaze) -> None:
    from blaze.daemon import MergeDaemon

    rounds: list[int] = []

    def run_round() -> Any:
        rounds.append(1)
        return blaze.merger.merge(blaze.buffer.pending_names())

    channel = small_channel("uint8")
    cutout = Cutout(channel, 0, Box((0, 0, 0), (32, 32, 4)), range(1))
    body = np.full(cutout.shape, 5, np.uint8).tobytes()
    daemon = MergeDaemon(blaze.buffer, blaze.requests, blaze.presence, run_round, interval_s=3600, backlog_bytes=10_000)
    assert daemon.step() is None  # nothing pending
    blaze.tier.write_body(cutout, body, "application/octet-stream", True)  # 4 KiB: under the backlog
    assert daemon.step() is None and not rounds
    request = blaze.requests.request_merge()
    assert daemon.step() is not None and blaze.requests.merge_status(request)["state"] == "done"  # type: ignore[index]
    for _ in range(3):
        blaze.tier.write_body(cutout, body, "application/octet-stream", True)  # 12 KiB: past it
    assert daemon.step() is not None and blaze.buffer.stats().blobs == 0
    blaze.tier.write_body(cutout, body, "application/octet-stream", True)
    daemon.interval_s = 0.0  # the oldest write has waited long enough
    assert daemon.step() is not None and len(rounds) == 3


def test_a_running_merger_announces_itself_and_retires_when_stopped(blaze: Blaze) -> None:
    import threading

    from blaze.daemon import MergeDaemon
    from blaze.merge import MergeResult
    from ndstore.ops.localstack import wait_until

    assert blaze.presence.merger() is None
    daemon = MergeDaemon(blaze.buffer, blaze.requests, blaze.presence, lambda: MergeResult(), interval_s=3600,
                         backlog_bytes=1 << 30, poll_s=0.05, identity={"master": "local[1]"})
    stop = threading.Event()
    runner = threading.Thread(target=daemon.run, args=(stop,))
    runner.start()
    try:
        wait_until(lambda: blaze.presence.merger() is not None, "the merger's announcement", timeout=10)
        announced = blaze.presence.merger()
        assert announced is not None and announced["master"] == "local[1]"
        assert announced["last_beat"] >= announced["since"]
        assert 0 < blaze.buffer.client.pttl("blz:merger") <= 15_000  # a dead merger stops being announced
    finally:
        stop.set()
        runner.join(10)
    assert blaze.presence.merger() is None


def test_acknowledged_blaze_writes_survive_a_sigkill_of_the_buffer_redis(tmp_path: Any, redis_url: str) -> None:
    import os
    import signal

    import redis

    from ndstore.ops.localstack import free_port, start_redis

    redis.Redis.from_url(redis_url).flushdb()
    port = free_port()
    proc = start_redis(tmp_path / "blaze-redis", port)  # AOF, appendfsync always: as `ndstore up` runs it
    try:
        url = f"redis://127.0.0.1:{port}/0"
        blaze = make_blaze(tmp_path, redis_url, url)
        channel = small_channel("uint8")
        ref = reference(channel, np.zeros(whole(channel).shape[1:], np.uint8),
                        write_random(blaze, channel, random.Random(8), 20))  # all acknowledged
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = start_redis(tmp_path / "blaze-redis", port)
        blaze = make_blaze(tmp_path, redis_url, url)
        assert blaze.buffer.stats().blobs == 20
        assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)
        blaze.merger.merge(blaze.buffer.pending_names())
        assert np.array_equal(blaze.base.read(whole(channel))[0], ref)
    finally:
        proc.kill()
        proc.wait()


class FailingPuts:
    """The object store, except that every put fails (an S3 outage)."""

    def __init__(self, objects: Any):
        self._objects = objects

    def __getattr__(self, name: str) -> Any:
        return getattr(self._objects, name)

    def put_many(self, items: Any) -> None:
        raise OSError("S3 is unavailable")


def test_an_object_store_failure_during_a_merge_keeps_every_blob_pending(blaze: Blaze) -> None:
    channel = small_channel("uint8")
    ref = reference(channel, np.zeros(whole(channel).shape[1:], np.uint8),
                    write_random(blaze, channel, random.Random(12), 15))
    def counts() -> tuple[int, int, int]:
        s = blaze.buffer.stats()
        return s.pending_bytes, s.blobs, s.supercuboids

    pending = counts()
    base = blaze.base
    real, base.objects = base.objects, FailingPuts(base.objects)  # type: ignore[assignment]
    with pytest.raises(OSError):
        blaze.merger.merge(blaze.buffer.pending_names())
    base.objects = real
    assert counts() == pending
    assert np.array_equal(blaze.tier.read(whole(channel))[0], ref)
    blaze.merger.merge(blaze.buffer.pending_names())
    assert np.array_equal(base.read(whole(channel))[0], ref)


def test_an_unreachable_buffer_is_a_retryable_storage_error() -> None:
    from ndstore.core.errors import StorageError
    from ndstore.ops.localstack import free_port
    from ndstore.storage import redis_client
    from ndstore.storage.blaze_buffer import RedisBlazeBuffer

    buffer = RedisBlazeBuffer(redis_client.connect(f"redis://127.0.0.1:{free_port()}/0"), 1 << 20)
    with pytest.raises(StorageError, match="retry"):
        buffer.append(b"{}", b"body", ["1&1&1&0&0&0"])
