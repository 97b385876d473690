"""Bounded thread-pool helpers: fan work out over many keys, keep order or take completion order,
and never leave a task running behind an exception."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import islice
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def map_completed(pool: ThreadPoolExecutor, fn: Callable[[K], V], keys: Iterable[K],
                  window: int | None = None) -> Iterator[tuple[K, V]]:
    """Yield (key, fn(key)) in completion order. With a ``window``, at most that many calls
    are started and not yet yielded at any time, so at most that many results are held: a
    large read's fetched objects arrive as fast as they are consumed, not all at once. The
    first exception propagates after the calls not yet started are cancelled and the running
    ones have finished: none is still at work when the caller goes on (a write's caller
    releases its locks next; a put still retrying behind it would land after them, over a
    later write). A single key runs in the calling thread: a hop to the pool and back costs
    more than the small writes and reads that plan one job."""
    keys = list(keys)
    if len(keys) == 1:
        yield keys[0], fn(keys[0])
        return
    waiting = iter(keys)
    limit = max(1, window or len(keys))
    running: dict[Future[V], K] = {}
    try:
        while True:
            for key in islice(waiting, limit - len(running)):
                running[pool.submit(fn, key)] = key
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            while done:  # popped, so a result is the caller's alone once yielded
                fut = done.pop()
                yield running.pop(fut), fut.result()
                del fut
    finally:
        for fut in running:
            fut.cancel()
        wait(running)


def map_ordered(pool: ThreadPoolExecutor, fn: Callable[[K], V], keys: Iterable[K], inline_up_to: int = 1) -> list[V]:
    """``pool.map`` into a list; up to ``inline_up_to`` keys run in the calling thread instead,
    where the hops to the pool and back would cost more than the work."""
    keys = list(keys)
    return [fn(k) for k in keys] if len(keys) <= inline_up_to else list(pool.map(fn, keys))


def run_all(pool: ThreadPoolExecutor, fn: Callable[[K], object], keys: Iterable[K], window: int | None = None) -> None:
    """``fn`` over every key, at most ``window`` at once (see map_completed)."""
    for _ in map_completed(pool, fn, keys, window):
        pass
