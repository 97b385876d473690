"""`ndstore daemons`: the flusher and the cache manager in one process, with a clean shutdown
that writes back every dirty supercuboid before it exits."""

from __future__ import annotations

import logging
import signal
import threading

from ndstore.wiring import services

log = logging.getLogger("ndstore.daemons")


def run_daemons() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    svc = services()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: stop.set())
    workers = [threading.Thread(target=d.run, args=(stop,), name=type(d).__name__, daemon=True)
               for d in (svc.flusher(), svc.cache_manager())]
    for w in workers:
        w.start()
    log.info("flusher (age %.1fs) and cache manager (%d-%d bytes) running",
             svc.config.flush_age_s, svc.config.cache_low_bytes, svc.config.cache_high_bytes)
    stop.wait()
    for w in workers:
        w.join(timeout=60)
    flushed = svc.cache_tier.flush_all()
    log.info("stopped; wrote back %d dirty supercuboids", flushed)
    return 0
