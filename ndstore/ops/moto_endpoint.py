"""moto's S3/SQS/DynamoDB/Lambda server on loopback, serving one request at a time.

The local stack (`ndstore up`), the tests and the benchmarks stand moto in for AWS. moto's
backends are not thread-safe, and one race loses data: a DynamoDB transaction whose condition
fails restores a copy of its whole table taken when it began, undoing what other requests wrote
to that table in between (the ingest pipeline lost a recorded tile that way when a duplicate
upload event raced a new one); an SQS delete rebuilds its queue's message list, dropping a message
sent meanwhile. AWS has no such races, so the stand-in must not have them either: this server
accepts connections on threads as moto's own does, but runs moto's application, and reads the
response it returns, under one lock. The one place moto waits inside a request, an SQS long poll
on an empty queue, gives the lock up while it waits, or no message could ever arrive to end it.

Some of moto's work grows where AWS's does not, and it runs under that one lock, so the tests and
the local stack wait on it: GetQueueAttributes of named attributes computes all of them three times
(counting the queue's messages each time); SendMessage counts them to read one attribute;
ReceiveMessage checks each message it hands out against the retention period through that same
call, so a receive from a queue of n messages took O(n^2); and every request lists moto's package
directory (a stat per service) to find its backend. These are answered here from the same state
with the work done once, or not at all where nothing reads it (`_do_slow_work_once`).

A retried TransactWriteItems (botocore retries a call whose answer was lost, with the same
ClientRequestToken) answers as DynamoDB does, success without a second write, where moto would
write again and a conditional transaction would fail on its own first attempt.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server

# moto's backends are process-wide, so is the lock that guards them.
_LOCK = threading.Lock()
_holding = threading.local()
_TRANSACT_WRITE = "DynamoDB_20120810.TransactWriteItems"
IDEMPOTENT_FOR_S = 600.0  # DynamoDB's window for a ClientRequestToken
IDEMPOTENT_TOKENS = 100_000  # the answers kept for it, oldest dropped first
# token -> (when, digest of the other parameters, (status, headers), body) of a transaction that succeeded
_succeeded: OrderedDict[str, tuple[float, str, tuple[str, list[tuple[str, str]]], bytes]] = OrderedDict()


class SerialApp:
    """A WSGI application that lets one request at a time into the application it wraps."""

    def __init__(self, app: Any):
        self.app = app
        _release_during_long_polls()
        _do_slow_work_once()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("HTTP_X_AMZ_TARGET") == _TRANSACT_WRITE:
            return self._transact_write(environ, start_response)
        return self._serially(environ, start_response)

    def _transact_write(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """A TransactWriteItems as DynamoDB answers it: botocore gives each call a
        ClientRequestToken and retries with it (after a lost answer, a reset connection, a 500),
        and a token that already succeeded answers success again without writing twice, for ten
        minutes; with other parameters it is an IdempotentParameterMismatchException. moto writes
        again, and a retried conditional write then fails on its own first attempt."""
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            request = json.loads(body)
            token = request.pop("ClientRequestToken", None) if isinstance(request, dict) else None
        except ValueError:
            token = None  # moto answers what it cannot parse
        if not isinstance(token, str):
            return self._serially(environ, start_response)
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        with _LOCK:
            now = time.monotonic()
            while _succeeded and next(iter(_succeeded.values()))[0] < now - IDEMPOTENT_FOR_S:
                _succeeded.popitem(last=False)
            done = _succeeded.get(token)
            if done is not None and done[1] != digest:
                start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.0")])
                return [json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#IdempotentParameterMismatchException",
                                    "message": "the ClientRequestToken was used with other parameters"}).encode()]
            if done is not None:
                start_response(*done[2])
                return [done[3]]
            answered: list[Any] = []

            def remember(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
                answered[:] = [status, headers]
                return start_response(status, headers, *exc_info)

            answer = b"".join(self._run(environ, remember))
            if answered and answered[0].startswith("200"):
                _succeeded[token] = (now, digest, (answered[0], answered[1]), answer)
                while len(_succeeded) > IDEMPOTENT_TOKENS:
                    _succeeded.popitem(last=False)
            return [answer]

    def _serially(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with _LOCK:
            return self._run(environ, start_response)

    def _run(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        """moto's answer, whole; the caller holds _LOCK."""
        _holding.lock = True
        try:
            result = self.app(environ, start_response)
            try:
                return list(result)  # a lazy body would read moto's state after the lock is gone
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        finally:
            _holding.lock = False


def _release_during_long_polls() -> None:
    from moto.sqs.models import Queue

    wait = Queue.wait_for_messages  # moto 5.2: ReceiveMessage waits here, up to 1 s at a time
    if getattr(wait, "releases_serial_lock", False):
        return

    def wait_for_messages(queue: Queue, timeout: int) -> None:
        if not getattr(_holding, "lock", False):
            return wait(queue, timeout)
        _holding.lock = False
        _LOCK.release()
        try:
            return wait(queue, timeout)
        finally:
            _LOCK.acquire()
            _holding.lock = True

    wait_for_messages.releases_serial_lock = True  # type: ignore[attr-defined]
    Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]


def _do_slow_work_once() -> None:
    from moto import backends
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    named = SQSBackend.get_queue_attributes  # moto 5.2
    if getattr(named, "counts_once", False):
        return
    modules = tuple(backends.list_of_moto_modules())  # the installed package's directories
    backends.list_of_moto_modules = lambda: modules

    def get_queue_attributes(backend: SQSBackend, queue_name: str, attribute_names: list[str]) -> dict[str, Any]:
        queue = backend.get_queue(queue_name)
        known = {*queue.BASE_ATTRIBUTES, *queue.FIFO_ATTRIBUTES, *queue.KMS_ATTRIBUTES}
        if not attribute_names or "All" in attribute_names or not set(attribute_names) <= known:
            return named(backend, queue_name, attribute_names)  # moto's answer, and its errors
        attributes = queue.attributes
        return {name: attributes[name] for name in attribute_names if attributes.get(name) is not None}

    def retained(backend: SQSBackend, queue_name: str, message: Any) -> bool:
        queue = backend.get_queue(queue_name)
        return bool(int(queue.message_retention_period) + message.sent_timestamp / 1000 > unix_time())

    get_queue_attributes.counts_once = True  # type: ignore[attr-defined]
    SQSBackend.get_queue_attributes = get_queue_attributes  # type: ignore[method-assign]
    SQSBackend.is_message_valid_based_on_retention_period = retained  # type: ignore[method-assign]
    SQSBackend.send_message = _sent_without_counting(SQSBackend.send_message)  # type: ignore[method-assign]


def _sent_without_counting(send: Any) -> Any:
    """moto's SendMessage (and each message of a batch, and each S3 event notification) reads one
    attribute of its queue, ContentBasedDeduplication, through `Queue.attributes`, which also counts
    the queue's messages three times: O(n) a send, O(n^2) to fill a queue. During a send the
    queue's attributes leave out those counts (an instance attribute that shadows moto's list, for
    the one request that holds the lock)."""
    from moto.sqs.models import Queue

    counts = {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed",
              "ApproximateNumberOfMessagesNotVisible"}
    uncounted = [name for name in Queue.BASE_ATTRIBUTES if name not in counts]

    def send_message(backend: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = backend.queues.get(queue_name)
        if queue is None:
            return send(backend, queue_name, *args, **kwargs)  # moto's QueueDoesNotExist
        queue.BASE_ATTRIBUTES = uncounted
        try:
            return send(backend, queue_name, *args, **kwargs)
        finally:
            del queue.BASE_ATTRIBUTES

    return send_message


def moto_app() -> SerialApp:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return SerialApp(DomainDispatcherApplication(create_backend_app))


class SerialMotoServer:
    """moto on `host:port` (port 0: a free one) in a thread of this process; `stop()` ends it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        from moto.moto_server.werkzeug_app import MotoRequestHandler

        self._server: BaseWSGIServer = make_server(host, port, moto_app(), threaded=True,
                                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> SerialMotoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ndstore.ops.moto_endpoint", description=__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # it logs every request
    SerialMotoServer(args.host, args.port).serve_forever()


if __name__ == "__main__":
    main()
