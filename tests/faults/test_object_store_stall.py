"""A stalled object store or index costs one call its timeouts, then every call fails at once
until the endpoint answers again (issue 47, DESIGN §9): S3 and DynamoDB adapters against moto
through the fault proxy, which holds every request of a service unanswered while its window is
open (a stalled endpoint: the connection is accepted, no answer comes).

Before, each call waited out its timeout on each of its 5 attempts (with botocore's default 60 s
timeout, five minutes), and every call after it did the same: a web worker's threads all waited.
"""

from __future__ import annotations

import time
import uuid

import pytest

from ndstore.core.errors import StorageError
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.core.stalls import STALLED_S
from ndstore.storage.aws import STALL_TIMEOUTS
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.s3 import S3ObjectStore
from tests.faults.proxy import Fault, FaultProxy

pytestmark = pytest.mark.faults

TIMEOUT_S = 1.0


def _timed_failure(call: object) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(StorageError) as failure:
        call()  # type: ignore[operator]
    return str(failure.value), time.monotonic() - started


def test_a_stalled_s3_costs_one_call_then_calls_fail_at_once(proxy: FaultProxy) -> None:
    store = S3ObjectStore(f"stall-{uuid.uuid4().hex[:8]}", proxy.url, timeout_s=TIMEOUT_S, parallelism=2)
    store.ensure_ready()
    store.put_many({"k": b"x" * 1000})
    with proxy.faults(Fault("timeout", service="s3", delay_s=60)):
        message, took = _timed_failure(lambda: dict(store.get_many(["k"])))
        assert took < (STALL_TIMEOUTS + 1) * (TIMEOUT_S + 0.5) + 3, took  # not 5 attempts of it
        for _ in range(5):
            message, took = _timed_failure(lambda: store.put_many({"other": b"y"}))
            assert took < 0.5, f"a call to a stalled S3 took {took:.1f} s"
            assert "s3" in message and "not answering" in message, message
    time.sleep(STALLED_S + 0.1)  # then one call probes the endpoint, and it answers
    assert dict(store.get_many(["k"])) == {"k": b"x" * 1000}
    store.put_many({"other": b"y"})


def test_a_stalled_dynamodb_index_costs_one_call_then_calls_fail_at_once(proxy: FaultProxy) -> None:
    index = DynamoSupercuboidIndex(f"stall-{uuid.uuid4().hex[:8]}", proxy.url, timeout_s=TIMEOUT_S)
    index.ensure_ready()
    volume = VolumeKey(1, 1, 1, 0, 0)
    with proxy.faults(Fault("timeout", service="dynamodb", delay_s=60)):
        _timed_failure(lambda: index.mortons(volume))
        message, took = _timed_failure(lambda: index.put_many([SupercuboidKey(volume, 3)]))
        assert took < 0.5, f"a call to a stalled DynamoDB took {took:.1f} s"
        assert "dynamodb" in message and "not answering" in message, message
    time.sleep(STALLED_S + 0.1)
    index.put_many([SupercuboidKey(volume, 3)])
    assert index.mortons(volume) == [3]
