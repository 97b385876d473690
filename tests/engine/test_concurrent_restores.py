"""Readers of every kind, a flusher and a writer meeting at once over ONE supercuboid that is
resident and dirty but lacks cuboids: the state a cache Redis is in after a restart from its AOF
(written cuboids kept, page-ins dropped: tests/engine/test_unlogged_page_ins.py). Several of
them restore the same absent cuboids at once, some under only a read lock; every read must
succeed and equal the numpy reference, whoever restored first (issue 47, item 5: concurrent
`no_cache` and direct reads answered 500, KeyError in `CacheTier._completed`).

Each round kills the real redis-server (SIGKILL) and restarts it from its AOF, so the absent
cuboids are absent again; a NEAR write then makes the supercuboid dirty, and a barrier releases
all threads together. A `no_cache` read and a `/v1/direct/` read are both `CoherentDirect.read`
(ndstore/engine/dataplane.py, `DataPlane.read`); so is the NDBlaze path's base read (`read_base`)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ndstore.core.geometry import Box
from ndstore.engine.cache.tier import CacheTier
from ndstore.engine.direct import CoherentDirect, RawReads
from ndstore.ops.localstack import free_port, start_redis
from tests.engine.conftest import make_cache_tier
from tests.engine.test_unlogged_page_ins import CHANNEL, FAR, NEAR, PER_SUPER, SUPER, WRITTEN, cut, forgotten_cuboids

ROUNDS = 5
# threads of each kind per round: most hold only read locks, where restores raced (a restore under
# a write lock has the supercuboid to itself)
THREADS = {"cache read": 1, "small cache read": 1, "no_cache/direct read": 4, "raw read": 1, "flusher": 3,
           "writer": 1}
WHOLE = Box((0, 0, 0), SUPER)  # the one supercuboid
WAIT_S = 60.0


def _far_ok(got: np.ndarray, expected: np.ndarray, base: np.ndarray) -> bool:
    """FAR as the reference has it, as the base tier had it, or one of the writer's uniform values."""
    far = got[FAR.slices_zyx()]
    return bool(len(np.unique(far)) == 1 or np.array_equal(far, expected[FAR.slices_zyx()])
                or np.array_equal(far, base[FAR.slices_zyx()]))


def _check(got: np.ndarray, expected: np.ndarray, base: np.ndarray, raw: bool) -> None:
    """The whole supercuboid as acknowledged (FAR: whichever write was last, see _far_ok); a raw
    read is the base tier as it is, so NEAR may still be what the base tier had before it."""
    assert _far_ok(got, expected, base), np.unique(got[FAR.slices_zyx()])[:5]
    got = got.copy()
    got[FAR.slices_zyx()] = expected[FAR.slices_zyx()]
    if raw and np.array_equal(got[NEAR.slices_zyx()], base[NEAR.slices_zyx()]):
        got[NEAR.slices_zyx()] = expected[NEAR.slices_zyx()]
    np.testing.assert_array_equal(got, expected)


def test_concurrent_restores_of_one_supercuboid_never_fail_a_read(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = start_redis(tmp_path / "redis", port)
    try:
        tier = make_cache_tier(tmp_path, url)
        rng = np.random.default_rng(47)
        extent = CHANNEL.extent(0)
        reference = rng.integers(1, 60000, extent.shape_zyx, dtype=np.uint16)
        tier.write_base(cut(extent), reference[np.newaxis])  # type: ignore[arg-type]
        base = reference[WHOLE.slices_zyx()].copy()  # what the base tier holds of it before any write
        tier.read(cut(WHOLE))  # type: ignore[arg-type]  # paged in (unlogged)
        tier.settle()
        near = rng.integers(1, 60000, NEAR.shape_zyx, dtype=np.uint16)
        tier.write(cut(NEAR), near[np.newaxis])  # type: ignore[arg-type]  # logged: survives the restart
        reference[NEAR.slices_zyx()] = near
        expected = reference[WHOLE.slices_zyx()]

        done = 0
        failures: list[tuple[str, BaseException]] = []
        for round_ in range(ROUNDS):
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = start_redis(tmp_path / "redis", port)
            tier = make_cache_tier(tmp_path, url)
            tier.write(cut(NEAR), near[np.newaxis])  # type: ignore[arg-type]  # dirty again; its cuboids are there
            tier.settle()
            assert tier._cache.is_dirty([WRITTEN]) == [True]
            absent = tier._cache.absent(WRITTEN, range(PER_SUPER))
            assert 0 < len(absent) < PER_SUPER, "the restart should leave page-ins absent"

            done += _one_round(tier, expected, base, round_ + 1, failures)
            tier.settle()

        assert not failures, f"{len(failures)} of {done} reads, writes and flushes failed: " + \
            "; ".join(f"{mode}: {exc!r}" for mode, exc in failures[:6])
        tier.upkeep.flush_all()
        reference[FAR.slices_zyx()] = ROUNDS
        np.testing.assert_array_equal(RawReads(tier).read(cut(extent))[0], reference)  # type: ignore[arg-type]
        assert tier.loss.lost() == {}
    finally:
        proc.kill()
        proc.wait()


def _one_round(tier: CacheTier, expected: np.ndarray, base: np.ndarray, value: int,
               failures: list[tuple[str, BaseException]]) -> int:
    """Every kind's threads released together by a barrier; what failed appended to ``failures``.
    Returns how many reads, writes and flushes ran."""
    modes: dict[str, Callable[[], Any]] = {
        "cache read": lambda: _check(tier.read(cut(WHOLE))[0], expected, base, raw=False),  # type: ignore[arg-type]
        "small cache read": lambda: _check(_into(tier.read(cut(FAR))[0], expected), expected, base,  # type: ignore[arg-type]
                                           raw=False),
        "no_cache/direct read": lambda: _check(CoherentDirect(tier).read(cut(WHOLE))[0], expected, base,  # type: ignore[arg-type]
                                               raw=False),
        "raw read": lambda: _check(RawReads(tier).read(cut(WHOLE))[0], expected, base, raw=True),  # type: ignore[arg-type]
        "flusher": lambda: tier.flush([WRITTEN]),
        "writer": lambda: tier.write(cut(FAR), np.full((1, *FAR.shape_zyx), value, np.uint16)),  # type: ignore[arg-type]
    }
    jobs = [(mode, step) for mode, step in modes.items() for _ in range(THREADS[mode])]
    start = threading.Barrier(len(jobs))

    def run(mode: str, step: Callable[[], Any]) -> None:
        try:
            start.wait(WAIT_S)
            step()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append((mode, exc))

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    return len(jobs)


def _into(far: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """A FAR read placed in a copy of the expected supercuboid (so only FAR is checked)."""
    whole = expected.copy()
    whole[FAR.slices_zyx()] = far
    return whole


def test_a_restore_under_a_read_lock_completes_what_it_found_absent_after_another_restored_it(
        tmp_path: Path) -> None:
    """The race the stress test above finds, every time: direct read A finds cuboids absent, then
    (held at its look at what is absent, the next step of its restore) direct read B restores
    them and answers; A must still answer them, from the base object it fetches."""
    with forgotten_cuboids(tmp_path) as (tier, reference):
        cache = tier._cache  # type: ignore[attr-defined]
        real = cache.absent
        first, restored = threading.Event(), threading.Event()

        def held(*args: Any) -> Any:
            if not first.is_set():
                first.set()
                assert restored.wait(WAIT_S), "the test never let A go on"
            return real(*args)

        cache.absent = held
        answers: list[Any] = []
        a = threading.Thread(target=lambda: answers.append(_outcome(lambda: CoherentDirect(tier).read(cut(WHOLE))[0])))
        a.start()
        assert first.wait(WAIT_S)
        expected = reference[WHOLE.slices_zyx()]
        np.testing.assert_array_equal(CoherentDirect(tier).read(cut(WHOLE))[0], expected)  # type: ignore[arg-type]  # B
        assert cache.absent(WRITTEN, range(PER_SUPER)) == []  # B restored every one
        restored.set()
        a.join(WAIT_S)
        [answer] = answers
        assert not isinstance(answer, BaseException), repr(answer)
        np.testing.assert_array_equal(answer, expected)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
        return exc
