"""The local stand-in for AWS Lambda's SQS triggers: worker processes poll the ingest queues
(the tile-events queue the tile bucket notifies, every job's supercuboid and cleanup queues, the
queue of stopped jobs' removal), the downsample queues (`<prefix>-ds-<job>`) and the
segmentation products queue (`<prefix>-seg`), and hand batches to the same handlers, in the SQS
event format; a record the handler reports as failed comes back after a short backoff and, after
the queue's `max_tries` receives, lands in its dead-letter queue (SQS's redrive policy does that, as on AWS).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from lambdas import downsample, segments
from lambdas import ingest as handlers
from ndstore.core.errors import StorageError
from ndstore.core.observe import NULL, Observer
from ndstore.logs import configure as configure_logs
from ndstore.storage.interfaces import Message, WorkQueue
from ndstore.wiring import services

log = logging.getLogger("ndstore.runner")
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def sqs_event(messages: list[Message], queue_arn: str) -> dict[str, Any]:
    return {"Records": [{
        "messageId": str(i), "receiptHandle": m.receipt, "body": m.body, "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn, "attributes": {"ApproximateReceiveCount": str(m.receive_count)},
    } for i, m in enumerate(messages)]}


def handler_for(queue: str, prefix: str) -> Handler | None:
    if queue == f"{prefix}-tile-events":
        return handlers.tile_uploaded
    if queue == f"{prefix}-reap":  # the removal of stopped jobs, a step at a time
        return handlers.cleanup
    if queue == f"{prefix}-seg":  # rebuilds of label channels' segmentation products
        return segments.rebuild
    if queue.endswith("-dlq") or not queue.startswith(f"{prefix}-"):
        return None
    if queue.endswith("-supercuboid"):
        return handlers.supercuboid
    if queue.rsplit("-", 1)[0].endswith("-ds"):
        return downsample.parent
    if queue.endswith("-cleanup"):
        return handlers.cleanup
    return None  # upload queues belong to the upload client


class QueuePoller:
    """One worker's loop over every queue with a handler."""

    def __init__(self, queues: WorkQueue, prefix: str, refresh_s: float = 2.0, observer: Observer = NULL,
                 retry_cap_s: int = 30):
        """``retry_cap_s``: the longest a failed record waits before it is tried again (2, 4, 8, ...
        seconds after its first, second, third failure, up to this)."""
        self.observer = observer
        self.retry_cap_s = retry_cap_s
        self.queues = queues
        self.prefix = prefix
        self.refresh_s = refresh_s
        self._routes: list[tuple[str, str, Handler]] = []
        self._refreshed = 0.0
        self._addresses: dict[str, tuple[str, str]] = {}  # queue name -> its URL and ARN (derived from the name)

    def routes(self) -> list[tuple[str, str, Handler]]:
        """The queues with a handler, listed again every ``refresh_s``; a queue's URL and ARN are
        looked up once, while it stays listed (two calls a queue a refresh otherwise)."""
        if time.monotonic() - self._refreshed > self.refresh_s:
            routes, addresses = [], {}
            for name in self.queues.names(f"{self.prefix}-"):
                handler = handler_for(name, self.prefix)
                if handler is None:
                    continue
                try:
                    address = self._addresses.get(name) or self._address(name)
                except StorageError:  # deleted since it was listed (its job completed): nothing to poll
                    continue
                if address:
                    addresses[name] = address
                    routes.append((*address, handler))
            self._routes, self._addresses, self._refreshed = routes, addresses, time.monotonic()
        return self._routes

    def _address(self, name: str) -> tuple[str, str] | None:
        url = self.queues.url(name)
        return (url, self.queues.arn(url)) if url else None

    def poll_once(self) -> int:
        """One receive per queue, each batch through its handler; returns messages handled."""
        handled = 0
        for url, arn, handler in self.routes():
            try:
                messages = self.queues.receive(url, 10, wait_s=0)
            except Exception:  # noqa: BLE001 - a queue deleted under us (job completed): next refresh drops it
                self._refreshed = 0.0
                continue
            if not messages:
                continue
            result = handler(sqs_event(messages, arn))
            failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
            self.observer.count("ingest_handled_total", len(messages) - len(failed), handler=handler.__name__,
                                outcome="done")
            self.observer.count("ingest_handled_total", len(failed), handler=handler.__name__, outcome="failed")
            try:
                for i, m in enumerate(messages):
                    if str(i) in failed:
                        self.queues.retry_later(m, min(self.retry_cap_s, 2 ** m.receive_count))
                    else:
                        self.queues.delete_message(url, m.receipt)
            except StorageError:  # the queue went meanwhile (its job stopped): its messages with it
                self._refreshed = 0.0
            handled += len(messages)
        return handled

    def run(self, stop: threading.Event | Any, idle_s: float = 0.2) -> None:
        while not stop.is_set():
            try:
                if not self.poll_once():
                    stop.wait(idle_s)
            except Exception:  # the queue service is down: keep trying
                log.exception("polling the ingest queues failed; retrying")
                stop.wait(2)


def _worker(stop: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent decides
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    configure_logs()
    ingest = services().ingest
    QueuePoller(ingest.queues, ingest.queue_prefix, observer=services().metrics).run(stop)


def run_runner(workers: int, stop: threading.Event) -> None:
    """Start `workers` processes and keep them until `stop`; each finishes its batch first."""
    services().ingest.ensure_ready(services().config.ingest_notify_queue)
    context = multiprocessing.get_context("spawn")
    child_stop = context.Event()
    procs = [context.Process(target=_worker, args=(child_stop,), name=f"ingest-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    log.info("ingest runner: %d worker processes on the queues %s-*", workers, services().ingest.queue_prefix)
    while not stop.is_set():
        for i, p in enumerate(procs):
            if not p.is_alive():  # a worker killed or crashed: its messages come back after their timeout
                log.warning("ingest worker %s exited (%s); starting another", p.name, p.exitcode)
                procs[i] = context.Process(target=_worker, args=(child_stop,), name=p.name)
                procs[i].start()
        stop.wait(1)
    child_stop.set()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the ingest pipeline's handlers, run locally")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    configure_logs()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: stop.set())
    run_runner(args.workers or services().config.ingest_workers, stop)
    log.info("ingest runner stopped")


if __name__ == "__main__":
    main()
