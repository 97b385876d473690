"""Counters and histograms shared by every process of the service, in one Redis hash.

Each process adds into its own memory (no round trip on the hot path) and a thread of its own
adds that into the hash `nd:metrics` every `flush_s` (HINCRBYFLOAT, so processes on any node
add up). `/metrics` reads the hash: web workers, daemons, the merger and the ingest runner are
all in it, wherever they run. A process that dies loses at most its last `flush_s` of counts; a
Redis that is away keeps them waiting in memory until it is back. Never raises into its callers.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import redis

from ndstore.core.observe import BUCKETS

log = logging.getLogger(__name__)
KEY = "nd:metrics"
SEP = "\x1f"


def _labels(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


@dataclass
class Histogram:
    buckets: list[float] = field(default_factory=lambda: [0.0] * (len(BUCKETS) + 1))  # per bucket, +Inf last
    sum: float = 0.0

    @property
    def count(self) -> float:
        return sum(self.buckets)


@dataclass
class Snapshot:
    counters: dict[tuple[str, str], float] = field(default_factory=dict)  # (name, labels json) -> total
    histograms: dict[tuple[str, str], Histogram] = field(default_factory=dict)


class RedisMetrics:
    def __init__(self, client: redis.Redis, flush_s: float = 1.0):
        self.client = client
        self.flush_s = flush_s
        self._pending: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failing = False

    # -- recording (the Observer port) -----------------------------------------------------------
    def count(self, name: str, value: float = 1, **labels: str) -> None:
        self._add(SEP.join(("c", name, _labels(labels))), value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        bucket = next((i for i, le in enumerate(BUCKETS) if value <= le), len(BUCKETS))
        base = SEP.join(("h", name, _labels(labels)))
        self._add(f"{base}{SEP}{bucket}", 1)
        self._add(f"{base}{SEP}sum", value)

    def _add(self, key: str, value: float) -> None:
        with self._lock:
            self._pending[key] += value
            if self._thread is None:
                self._thread = threading.Thread(target=self._flush_forever, name="metrics", daemon=True)
                self._thread.start()

    # -- flushing -----------------------------------------------------------------------------
    def flush(self) -> bool:
        """Add what this process counted into the shared hash; False (kept for the next try)
        when Redis is away."""
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
        if not pending:
            return True
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in pending.items():
                pipe.hincrbyfloat(KEY, key, value)
            pipe.execute()
            self._failing = False
            return True
        except redis.exceptions.RedisError as exc:
            (log.debug if self._failing else log.warning)("metrics not flushed (kept for the next try): %s", exc)
            self._failing = True
            with self._lock:
                for key, value in pending.items():
                    self._pending[key] += value
            return False

    def _flush_forever(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.flush_s):
            self.flush()

    # -- reading (for /metrics) ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Everything every process has flushed. Raises StorageError-free redis errors to the caller."""
        raw: dict[bytes, bytes] = self.client.hgetall(KEY)  # type: ignore[assignment]
        out = Snapshot()
        for key_bytes, value_bytes in raw.items():
            kind, name, labels, *rest = key_bytes.decode().split(SEP)
            value = float(value_bytes)
            if kind == "c":
                out.counters[(name, labels)] = value
                continue
            histogram = out.histograms.setdefault((name, labels), Histogram())
            if rest == ["sum"]:
                histogram.sum = value
            else:
                histogram.buckets[int(rest[0])] = value
        return out

    def reset(self) -> None:
        """Forget every count (tests)."""
        with self._lock:
            self._pending.clear()
        self.client.delete(KEY)


def labels_of(raw: str) -> dict[str, Any]:
    return json.loads(raw)  # type: ignore[no-any-return]
