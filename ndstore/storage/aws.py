"""What every AWS adapter shares: the boto3 client (retries, timeouts, DynamoDB's answer
checksums, the endpoint's Breaker) and the call wrapper that turns any botocore failure into a
StorageError.

Each client's calls share one Breaker per service and endpoint (ndstore/core/stalls.py): when
STALL_TIMEOUTS attempts in a row run into their timeout (S3 is many servers: one slow request is
not a stall), the endpoint is marked stalled, and attempts fail at once (a StorageError: 503)
instead of each waiting out its timeout and retries; one attempt at a time probes it again."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ChecksumError, ClientError, ConnectTimeoutError, ReadTimeoutError
from botocore.retryhandler import CRC32Checker

from ndstore.core.errors import StorageError
from ndstore.core.stalls import Breaker, breaker

MISSING = {"NoSuchKey", "404", "NotFound"}
_ATTEMPTS = 5
STALL_TIMEOUTS = 3
_DYNAMODB_CRC32 = CRC32Checker(header="x-amz-crc32")  # botocore's own check, left to its legacy retry mode


@dataclass(frozen=True)
class Credentials:
    """Explicit AWS credentials (from the service's Config); None elsewhere: boto3's own chain."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def client_kwargs(self) -> dict[str, str | None]:
        return {"aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key,
                "aws_session_token": self.session_token}


# One boto3 session makes every client of the process: a session loads botocore's service models
# and endpoint rules from disk the first time it makes a client of each service (~0.2 s a client),
# and caches them. A session is not thread-safe, so clients are made one at a time; explicit
# credentials go to the client, so clients with different credentials share the session too.
_SESSION_LOCK = threading.Lock()


@functools.cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()


def _after_fork_in_child() -> None:  # a lock held by another thread at the fork is never released
    global _SESSION_LOCK
    _SESSION_LOCK = threading.Lock()
    _session.cache_clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def new_client(service: str, credentials: Credentials | None = None, **kwargs: Any) -> Any:
    """A boto3 client made by the process's one session (``kwargs``: those of `Session.client`)."""
    explicit = credentials.client_kwargs() if credentials else {}
    with _SESSION_LOCK:
        return _session().client(service, **explicit, **kwargs)


def aws_client(service: str, endpoint_url: str | None, region: str, pool: int, timeout_s: float | None = None,
               credentials: Credentials | None = None) -> Any:
    """A boto3 client: 5 attempts with backoff; ``timeout_s`` is the connect and read timeout of
    each attempt (None: botocore's 60 s)."""
    timeouts = {} if timeout_s is None else {"connect_timeout": timeout_s, "read_timeout": timeout_s}
    config = Config(max_pool_connections=pool, retries={"mode": "standard", "max_attempts": _ATTEMPTS}, **timeouts)
    client = new_client(service, credentials, endpoint_url=endpoint_url, region_name=region, config=config)
    if service == "dynamodb":
        client.meta.events.register("needs-retry.dynamodb", _retry_when_the_crc32_does_not_match)
    _watch_for_stalls(client, service, timeout_s or 60.0)
    return client


def _watch_for_stalls(client: Any, service: str, timeout_s: float) -> None:
    """Attempts of ``client`` refused at once while its endpoint is stalled; timeouts counted."""
    where = client.meta.endpoint_url
    stall = breaker(f"aws:{service}:{where}", f"{service} at {where}", STALL_TIMEOUTS)
    events, name = client.meta.events, client.meta.service_model.service_id.hyphenize()
    events.register(f"before-send.{name}", lambda **_: stall.admit(timeout_s + 1))
    events.register(f"needs-retry.{name}", lambda **kw: _note_outcome(stall, **kw))


def _note_outcome(stall: Breaker, response: Any = None, caught_exception: Exception | None = None,
                  **_: Any) -> None:
    if isinstance(caught_exception, (ReadTimeoutError, ConnectTimeoutError)):
        stall.failed(f"no answer within its timeout: {caught_exception}")
    elif response is not None:
        stall.answered()


def _retry_when_the_crc32_does_not_match(response: Any = None, attempts: int = 1, **_: Any) -> float | None:
    """DynamoDB signs each answer's body with `x-amz-crc32`. botocore's standard retry mode does
    not check it, and its JSON parser takes a body cut off half way for an answer with no fields:
    a BatchWriteItem with nothing unprocessed, a GetItem of nothing, an empty Query page. A
    mismatch is retried like a broken connection; after the last attempt it is an error."""
    if response is None or response[0] is None:
        return None
    try:
        _DYNAMODB_CRC32(attempts, response, None)  # raises ChecksumError on a mismatch
    except ChecksumError:
        if attempts >= _ATTEMPTS:
            raise
        return float(min(0.05 * 2**attempts, 2.0))
    return None


def aws_call(service: str, fn: Any, **kwargs: Any) -> Any:
    """Call a boto3 client method; any botocore failure becomes a StorageError naming it."""
    try:
        return fn(**kwargs)
    except (BotoCoreError, ClientError) as exc:
        raise StorageError(f"{service} {fn.__name__} failed: {exc}") from exc
