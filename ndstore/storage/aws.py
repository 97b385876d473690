"""What every AWS adapter shares: the boto3 client (retries, timeouts, DynamoDB's answer
checksums) and the call wrapper that turns any botocore failure into a StorageError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ChecksumError, ClientError
from botocore.retryhandler import CRC32Checker

from ndstore.core.errors import StorageError

MISSING = {"NoSuchKey", "404", "NotFound"}
_ATTEMPTS = 5
_DYNAMODB_CRC32 = CRC32Checker(header="x-amz-crc32")  # botocore's own check, left to its legacy retry mode


@dataclass(frozen=True)
class Credentials:
    """Explicit AWS credentials (from the service's Config); None elsewhere: boto3's own chain."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def session(self) -> boto3.session.Session:
        return boto3.session.Session(aws_access_key_id=self.access_key_id,
                                     aws_secret_access_key=self.secret_access_key,
                                     aws_session_token=self.session_token)


def session(credentials: Credentials | None) -> boto3.session.Session:
    return credentials.session() if credentials else boto3.session.Session()


def aws_client(service: str, endpoint_url: str | None, region: str, pool: int, timeout_s: float | None = None,
               credentials: Credentials | None = None) -> Any:
    """A boto3 client: 5 attempts with backoff; ``timeout_s`` is the connect and read timeout of
    each attempt (None: botocore's 60 s)."""
    timeouts = {} if timeout_s is None else {"connect_timeout": timeout_s, "read_timeout": timeout_s}
    config = Config(max_pool_connections=pool, retries={"mode": "standard", "max_attempts": _ATTEMPTS}, **timeouts)
    client = session(credentials).client(service, endpoint_url=endpoint_url, region_name=region, config=config)
    if service == "dynamodb":
        client.meta.events.register("needs-retry.dynamodb", _retry_when_the_crc32_does_not_match)
    return client


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
