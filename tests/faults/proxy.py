"""A fault-injecting HTTP proxy on 127.0.0.1 in front of moto's endpoint (S3, DynamoDB, SQS).

Every request is forwarded as it came (method, path and query, headers, body) and the answer
relayed back, except while a fault window is open (`with proxy.faults(Fault(...), ...)`): then a
request that a rule matches (its AWS service, an optional predicate, a fraction drawn from a
seeded generator, at most `times` times per window) gets the rule's fault instead of the
upstream's answer:

  500       500 InternalError (S3 XML) / InternalFailure (DynamoDB, SQS JSON)
  503       503 SlowDown (S3) / ServiceUnavailable (DynamoDB, SQS)
  throttle  400 ProvisionedThroughputExceededException (DynamoDB; `code` may name
            ThrottlingException), 400 ThrottlingException (SQS), 503 SlowDown (S3)
  timeout   no answer: held `delay_s` (longer than the client's read timeout) or until the
            window closes, then the connection is closed; never forwarded
  hold      no answer until the window closes, then closed, never forwarded: a test waits for
            `wait_held()` and acts while the caller is stuck half way through its work
  truncate  forwarded; the answer's status and full Content-Length, half its body, then closed

Requests are told apart by their SigV4 credential scope (`.../<service>/aws4_request`), else by
X-Amz-Target (`DynamoDB_20120810.*`, `AmazonSQS.*`). Each request and what it got is logged
(`seen`) so tests can check that a fault really happened. Keep-alive on both sides; the
upstream's Host header is the proxy's, so URLs moto builds (SQS queue URLs) point here.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import urllib3

KINDS = ("500", "503", "throttle", "timeout", "hold", "truncate")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length"}
_SCOPE = re.compile(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request")


@dataclass(frozen=True)
class Call:
    service: str  # "s3", "dynamodb", "sqs", ... ("" if unknown)
    method: str
    path: str  # percent-decoded path and query
    operation: str  # X-Amz-Target's operation (DynamoDB, SQS), "" for S3's REST calls
    head: bytes = b""  # the body's first KiB (an SQS call's QueueUrl, a DynamoDB call's TableName)


@dataclass(frozen=True)
class Fault:
    kind: str
    service: str | None = None  # None: any service
    fraction: float = 1.0
    match: Callable[[Call], bool] | None = None
    delay_s: float = 30.0  # timeout: how long a request is held at most
    code: str | None = None  # the error code, instead of the kind's usual one
    times: int | None = None  # at most this many faults per window (None: no limit)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; known: {', '.join(KINDS)}")


@dataclass(frozen=True)
class Seen:
    call: Call
    outcome: str  # "forwarded" or the fault's kind
    status: int  # what the client got (0: nothing)


def _classify(method: str, path: str, headers: dict[str, str], body: bytes) -> Call:
    scope = _SCOPE.search(headers.get("authorization", ""))
    target = headers.get("x-amz-target", "")
    service = scope.group(1) if scope else ""
    if not service and target.startswith("DynamoDB"):
        service = "dynamodb"
    elif not service and target.startswith("AmazonSQS"):
        service = "sqs"
    return Call(service, method, unquote(path), target.rpartition(".")[2], body[:1024])


def _error(call: Call, kind: str, code: str | None) -> tuple[int, str, bytes]:
    """Status, content type and body of the error a real endpoint answers for this fault."""
    if call.service == "s3":
        status, default = {"500": (500, "InternalError")}.get(kind, (503, "SlowDown"))
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code or default}</Code>'
                f"<Message>injected fault: {kind}</Message><RequestId>fault</RequestId></Error>")
        return status, "application/xml", body.encode()
    throttled = "ProvisionedThroughputExceededException" if call.service == "dynamodb" else "ThrottlingException"
    status, default = {"500": (500, "InternalFailure"), "503": (503, "ServiceUnavailable")}.get(kind, (400, throttled))
    error = {"__type": f"com.amazonaws.{call.service or 'aws'}#{code or default}", "message": f"injected fault: {kind}"}
    return status, "application/x-amz-json-1.0", json.dumps(error).encode()


class FaultProxy:
    """The proxy: `start()`, `url`, `faults(...)` windows, `seen` log, `stop()`."""

    def __init__(self, upstream: str, seed: int = 0):
        self.upstream = upstream.rstrip("/")
        self.seen: list[Seen] = []
        self._rules: tuple[Fault, ...] = ()
        self._used: list[int] = []
        self._random = random.Random(seed)
        self._guard = threading.Condition()
        self._released = threading.Event()
        self._held = 0
        self._http = urllib3.PoolManager(maxsize=32, retries=False, timeout=urllib3.Timeout(connect=5, read=120))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False  # keep-alive threads end with the process
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._close_window()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    @contextmanager
    def faults(self, *rules: Fault) -> Iterator[None]:
        """A fault window: while it is open, matching requests get their rule's fault (the first
        rule that matches wins). Closing it releases every held request."""
        with self._guard:
            self._released.clear()
            self._rules, self._used = rules, [0] * len(rules)
        try:
            yield
        finally:
            self._close_window()

    def wait_held(self, count: int = 1, timeout: float = 60) -> None:
        with self._guard:
            if not self._guard.wait_for(lambda: self._held >= count, timeout):
                raise TimeoutError(f"no {count} request(s) held within {timeout}s: {self.seen[-5:]}")

    def count(self, outcome: str | None = None, where: Callable[[Seen], bool] = lambda s: True) -> int:
        with self._guard:
            return sum(1 for s in self.seen if (outcome is None or s.outcome == outcome) and where(s))

    def _close_window(self) -> None:
        with self._guard:
            self._rules = ()
            self._held = 0
        self._released.set()

    def _pick(self, call: Call) -> Fault | None:
        with self._guard:
            for i, rule in enumerate(self._rules):
                if (rule.service in (None, call.service) and (rule.match is None or rule.match(call))
                        and (rule.times is None or self._used[i] < rule.times)
                        and self._random.random() < rule.fraction):
                    self._used[i] += 1
                    if rule.kind == "hold":
                        self._held += 1
                        self._guard.notify_all()
                    return rule
        return None

    def _log(self, call: Call, outcome: str, status: int) -> None:
        with self._guard:
            self.seen.append(Seen(call, outcome, status))

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> urllib3.BaseHTTPResponse:
        return self._http.urlopen(method, self.upstream + path, body=body or None, headers=headers, redirect=False,
                                  preload_content=True, decode_content=False)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 120  # an idle keep-alive connection's thread ends after this

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            body = self._body()
            call = _classify(self.command, self.path, {k.lower(): v for k, v in headers.items()}, body)
            fault = proxy._pick(call)
            if fault is None or fault.kind == "truncate":
                reply = proxy._forward(self.command, self.path, headers, body)
                data = reply.data or b""
                # logged before the client has its answer: a test that counts what it has seen
                # once a call returned finds the call's requests there
                proxy._log(call, "forwarded" if fault is None else "truncate", reply.status)
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    if k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                length = reply.headers.get("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data if fault is None else data[: len(data) // 2])
                self.close_connection = fault is not None
                return
            if fault.kind in ("timeout", "hold"):
                proxy._released.wait(fault.delay_s if fault.kind == "timeout" else None)
                proxy._log(call, fault.kind, 0)
                self.close_connection = True
                return
            status, content_type, payload = _error(call, fault.kind, fault.code)
            proxy._log(call, fault.kind, status)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle  # noqa: N815 - http.server's names

    return Handler
