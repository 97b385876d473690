"""The merger daemon: runs a merge round when the oldest pending write has waited
`merge_interval_s`, when the backlog passes `merge_backlog_bytes`, or when a merge is requested
(CLI or the admin endpoint); reports each request's outcome in the buffer. Each step first
checks the buffer's Redis against its ledger (nothing is merged from a Redis that came back
short) and ends by bringing the ledger up to date (ndstore/engine/ledger.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from blaze.merge import MergeResult
from ndstore.core.observe import NULL, Observer
from ndstore.engine.cache.daemons import rounds
from ndstore.engine.ledger import LedgerKeeper
from ndstore.storage.interfaces import BlazeBuffer, MergeRequests, MergerPresence

log = logging.getLogger("ndstore.blaze")
HEARTBEAT_S = 5.0


class MergeDaemon:
    def __init__(self, buffer: BlazeBuffer, requests: MergeRequests, presence: MergerPresence,
                 run_round: Callable[[], MergeResult], interval_s: float, backlog_bytes: int, poll_s: float = 0.5,
                 identity: dict[str, Any] | None = None, observer: Observer = NULL,
                 ledger: LedgerKeeper | None = None):
        self.observer = observer
        self.ledger = ledger
        self.buffer = buffer
        self.requests = requests
        self.presence = presence
        self.identity = {**(identity or {}), "since": time.time()}
        self.run_round = run_round
        self.interval_s = interval_s
        self.backlog_bytes = backlog_bytes
        self.poll_s = poll_s

    def due(self) -> bool:
        stats = self.buffer.stats()
        if stats.blobs == 0:
            return False
        return stats.pending_bytes >= self.backlog_bytes or (stats.oldest_age_s or 0.0) >= self.interval_s

    def beat(self) -> None:
        """Tell readers of the buffer (status, `ndstore up`) that a merger is alive."""
        self.presence.announce_merger({**self.identity, "last_beat": time.time()}, ttl_s=3 * HEARTBEAT_S)

    def _beat_until(self, stop: threading.Event) -> None:
        """Beats from a thread of their own, so a long merge round does not look like a dead merger."""
        while not stop.is_set():
            try:
                self.beat()
            except Exception:  # the buffer is down; the round loop reports it
                log.warning("could not announce the merger to the buffer", exc_info=True)
            stop.wait(HEARTBEAT_S)

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._beat_until, args=(stop,), name="merger-heartbeat", daemon=True).start()
        try:
            rounds(self.step, self.poll_s, stop, "merger", self.observer)
            if self.ledger is not None:
                self.ledger.keep(final=True)
        finally:
            try:
                self.presence.retire_merger()
            except Exception:  # noqa: BLE001 - the announcement expires by itself
                pass


    def step(self) -> MergeResult | None:
        """One look at the buffer: a merge round if one is due or requested."""
        if self.ledger is not None:
            self.ledger.check()
        result = self._merge_if_due()
        if self.ledger is not None:
            self.ledger.keep()
        return result

    def _merge_if_due(self) -> MergeResult | None:
        requests = self.requests.take_merge_requests()
        if not requests and not self.due():
            return None
        started = time.time()
        for r in requests:
            self.requests.set_merge_status(r["id"], {"state": "running", "started_at": started})
        try:
            result = self.run_round()
        except Exception as exc:
            for r in requests:
                self.requests.set_merge_status(r["id"], {"state": "failed", "started_at": started, "error": str(exc)})
            raise
        for r in requests:
            self.requests.set_merge_status(r["id"], {"state": "done", "started_at": started, "finished_at": time.time(),
                                                   **result.as_dict()})
        self.observer.count("blaze_merged_blobs_total", result.blobs_applied)
        self.observer.count("blaze_merged_supercuboids_total", result.supercuboids)
        if result.supercuboids_failed:
            self.observer.count("blaze_merge_failures_total", result.supercuboids_failed)
        if result.supercuboids:
            log.info("merged %d blobs into %d supercuboids in %.1fs", result.blobs_applied, result.supercuboids,
                     result.seconds)
        return result
