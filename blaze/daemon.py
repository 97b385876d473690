"""The merger daemon: runs a merge round when the oldest pending write has waited
`merge_interval_s`, when the backlog passes `merge_backlog_bytes`, or when a merge is requested
(CLI or the admin endpoint); reports each request's outcome in the buffer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from blaze.buffer import RedisBlazeBuffer
from blaze.merge import MergeResult

log = logging.getLogger("ndstore.blaze")


class MergeDaemon:
    def __init__(self, buffer: RedisBlazeBuffer, run_round: Callable[[], MergeResult], interval_s: float,
                 backlog_bytes: int, poll_s: float = 0.5):
        self.buffer = buffer
        self.run_round = run_round
        self.interval_s = interval_s
        self.backlog_bytes = backlog_bytes
        self.poll_s = poll_s

    def due(self) -> bool:
        stats = self.buffer.stats()
        if stats.blobs == 0:
            return False
        return stats.pending_bytes >= self.backlog_bytes or (stats.oldest_age_s or 0.0) >= self.interval_s

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a failed round is retried; the daemon lives on
                log.exception("merge round failed; retrying in %.0fs", 5)
                stop.wait(5)
            stop.wait(self.poll_s)

    def step(self) -> MergeResult | None:
        """One look at the buffer: a merge round if one is due or requested."""
        requests = self.buffer.take_merge_requests()
        if not requests and not self.due():
            return None
        started = time.time()
        for r in requests:
            self.buffer.set_merge_status(r["id"], {"state": "running", "started_at": started})
        try:
            result = self.run_round()
        except Exception as exc:
            for r in requests:
                self.buffer.set_merge_status(r["id"], {"state": "failed", "started_at": started, "error": str(exc)})
            raise
        for r in requests:
            self.buffer.set_merge_status(r["id"], {"state": "done", "started_at": started, "finished_at": time.time(),
                                                   **result.as_dict()})
        if result.supercuboids:
            log.info("merged %d blobs into %d supercuboids in %.1fs", result.blobs_applied, result.supercuboids,
                     result.seconds)
        return result
