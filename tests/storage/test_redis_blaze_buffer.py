"""What only the Redis NDBlaze buffer promises (its ports' contract runs in tests/contracts/): a
small append waits for one round trip."""

from __future__ import annotations

import pytest
import redis

from ndstore.storage.blaze_buffer import RedisBlazeBuffer
from tests.round_trips import RoundTrips


def test_an_append_is_one_round_trip(blaze_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small NDBlaze write waits for one reply: redis-py checks a registered script in a pipeline
    with SCRIPT EXISTS before it sends the pipeline (a second round trip on every write)."""
    client = redis.Redis.from_url(blaze_redis_url)
    client.flushdb()
    buffer = RedisBlazeBuffer(client, 1 << 20)
    buffer.start_epoch("run-1", 0)
    trips = RoundTrips(monkeypatch)
    for i in range(3):  # the first too: Redis may not know the script yet
        sent, seq = trips.during(lambda i=i: buffer.append(b"{}", bytes([i]) * 100, ["sc-a", "sc-b"]))
        assert sent == 1 and seq == i + 1
