"""Counters and histograms shared by every process of the service, in one Redis hash.

Each process adds into its own memory (no round trip on the hot path) and one thread per
process adds that into the hash `nd:metrics` every FLUSH_S (HINCRBYFLOAT, so processes on any
node add up); it holds the recorders weakly, so services built again (tests, a reconfigured
process) leave no thread behind. `/metrics` reads the hash: web workers, daemons, the merger and the ingest runner are
all in it, wherever they run. A process that dies loses at most its last `flush_s` of counts; a
Redis that is away keeps them waiting in memory until it is back. Never raises into its callers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import defaultdict

import redis

from ndstore.core.observe import BUCKETS
from ndstore.storage.interfaces import Histogram, Snapshot

log = logging.getLogger(__name__)
KEY = "nd:metrics"
SEP = "\x1f"
FLUSH_S = 1.0


class RedisMetrics:
    def __init__(self, client: redis.Redis):
        self.client = client
        self._pending: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: see flush()
        self._failing = False
        _flusher.add(self)

    # -- recording (the Observer port) -----------------------------------------------------------
    def count(self, name: str, value: float = 1, **labels: str) -> None:
        self._add(SEP.join(("c", name, Snapshot.labels_key(labels))), value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        bucket = next((i for i, le in enumerate(BUCKETS) if value <= le), len(BUCKETS))
        base = SEP.join(("h", name, Snapshot.labels_key(labels)))
        self._add(f"{base}{SEP}{bucket}", 1)
        self._add(f"{base}{SEP}sum", value)

    def _add(self, key: str, value: float) -> None:
        with self._lock:
            self._pending[key] += value

    # -- flushing -----------------------------------------------------------------------------
    def flush(self) -> bool:
        """Add what this process counted into the shared hash; False (kept for the next try)
        when Redis is away. When it returns, everything counted before the call is in the hash:
        a flush by the flusher thread that took the counts a moment earlier has finished too
        (else a scrape right after could miss counts still on their way)."""
        with self._flushing:
            return self._flush()

    def _flush(self) -> bool:
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

    def close(self) -> bool:
        """Flush what is left and leave the process's flusher thread, which would otherwise keep
        trying to flush into this recorder's Redis after whoever started it has stopped it."""
        _flusher.discard(self)
        return self.flush()

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


class _Flusher:
    """The process's one flushing thread, started with the first recorder."""

    def __init__(self) -> None:
        self.recorders: weakref.WeakSet[RedisMetrics] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, recorder: RedisMetrics) -> None:
        with self.lock:
            self.recorders.add(recorder)
            if self.thread is None or not self.thread.is_alive():  # (a fork keeps no threads)
                self.thread = threading.Thread(target=self.run, name="metrics", daemon=True)
                self.thread.start()

    def discard(self, recorder: RedisMetrics) -> None:
        with self.lock:
            self.recorders.discard(recorder)

    def run(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            with self.lock:
                recorders = list(self.recorders)
            for recorder in recorders:
                recorder.flush()
            del recorders


    def after_fork(self) -> None:
        """A forked child (a gunicorn worker of a preloaded app) has no threads: it starts its
        own, and what the parent counted before the fork is the parent's to flush."""
        self.lock = threading.Lock()
        self.thread = None
        for recorder in list(self.recorders):
            recorder._lock = threading.Lock()
            recorder._flushing = threading.Lock()
            recorder._pending = defaultdict(float)
            self.add(recorder)


_flusher = _Flusher()
os.register_at_fork(after_in_child=_flusher.after_fork)


labels_of = Snapshot.labels
