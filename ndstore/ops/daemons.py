"""`ndstore daemons`: the flusher and the cache manager in one process, with a clean shutdown
that writes back every dirty supercuboid before it exits. `ndstore blaze merger`: the NDBlaze
merge daemon, in a process of its own (it holds a Spark driver)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from functools import partial

from blaze.daemon import MergeDaemon
from blaze.merge import MergeResult
from blaze.spark_job import merge_round, spark_session
from ndstore.logs import configure as configure_logs
from ndstore.wiring import merger_for, services

log = logging.getLogger("ndstore.daemons")


def _stop_on_signals() -> threading.Event:
    configure_logs()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: stop.set())
    return stop


def run_daemons() -> int:
    stop = _stop_on_signals()
    svc = services()
    workers = [threading.Thread(target=d.run, args=(stop,), name=type(d).__name__, daemon=True)
               for d in (svc.flusher(), svc.cache_manager())]
    for w in workers:
        w.start()
    log.info("flusher (age %.1fs) and cache manager (%d-%d bytes) running",
             svc.config.flush_age_s, svc.config.cache_low_bytes, svc.config.cache_high_bytes)
    stop.wait()
    for w in workers:
        w.join(timeout=60)
    flushed = svc.cache_tier.upkeep.flush_all()
    svc.cache_tier.loss.keep_ledger(final=True)
    log.info("stopped; wrote back %d dirty supercuboids", flushed)
    return 0


def merge_now(master: str | None = None) -> MergeResult:
    """One merge round of everything pending, in this process, on Spark."""
    svc = services()
    spark = spark_session(master or svc.config.spark_master)
    try:
        result = merge_round(spark, svc.blaze_buffer, partial(merger_for, svc.config))
    finally:
        spark.stop()
    svc.blaze_ledger.keep()  # the ledger and the record of NDBlaze writes, as the merger daemon's round ends
    return result


def run_merger() -> int:
    configure_logs()
    svc = services()
    c = svc.config
    spark = spark_session(c.spark_master)
    stop = _stop_on_signals()  # after Spark's own SIGINT handler, which would raise anywhere
    make_merger = partial(merger_for, c)
    daemon = MergeDaemon(svc.blaze_buffer, svc.merge_requests, svc.merger_presence,
                         lambda: merge_round(spark, svc.blaze_buffer, make_merger),
                         c.blaze_merge_interval_s, c.blaze_merge_backlog_bytes,
                         identity={"master": c.spark_master, "pid": os.getpid()}, observer=svc.metrics,
                         ledger=svc.blaze_ledger)
    log.info("NDBlaze merger on %s: every %.0fs or past %d pending bytes", c.spark_master,
             c.blaze_merge_interval_s, c.blaze_merge_backlog_bytes)
    try:
        daemon.run(stop)
    finally:
        spark.stop()
    log.info("NDBlaze merger stopped")
    return 0
