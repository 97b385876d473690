"""The NDBlaze buffer's ports' contract on their implementation: RedisBlazeBuffer,
RedisMergeRequests and RedisMergerPresence on a real redis-server (the session's NDBlaze Redis,
emptied for each test), and on a Redis port where none listens for `away`."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ndstore.storage.blaze_buffer import RedisBlazeBuffer, RedisMergeRequests, RedisMergerPresence, blob_key
from ndstore.testing.blaze_buffer import LIMIT, BlazeBufferContract, Ports


def redis_ports(client: redis.Redis) -> Ports:
    return Ports(RedisBlazeBuffer(client, LIMIT), RedisMergeRequests(client), RedisMergerPresence(client))


class TestRedisBlazeBuffer(BlazeBufferContract):
    @pytest.fixture
    def fresh_ports(self, blaze_redis_url: str) -> Ports:
        client = redis.Redis.from_url(blaze_redis_url)
        client.flushdb()
        return redis_ports(client)

    @pytest.fixture
    def away(self) -> Ports:
        return redis_ports(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                                       retry=Retry(NoBackoff(), 0)))

    def damage(self, ports: Ports, seq: int) -> None:
        assert isinstance(ports.buffer, RedisBlazeBuffer)
        ports.buffer.client.setrange(f"{blob_key(seq)}:0", 4, b"X")  # a flipped byte, as a damaged AOF would load it
