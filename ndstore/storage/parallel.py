"""A bounded thread pool helper shared by adapters that fan I/O out over many keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def map_completed(pool: ThreadPoolExecutor, fn: Callable[[K], V], keys: Iterable[K]) -> Iterator[tuple[K, V]]:
    """Yield (key, fn(key)) in completion order. The first exception propagates after the
    remaining calls are cancelled."""
    futures: dict[Future[V], K] = {pool.submit(fn, k): k for k in keys}
    try:
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        for fut in futures:
            fut.cancel()


def run_all(pool: ThreadPoolExecutor, fn: Callable[[K], object], keys: Iterable[K]) -> None:
    for _ in map_completed(pool, fn, keys):
        pass
