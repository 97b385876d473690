"""RedisMetrics.flush(): when it returns, every count made before it is in the shared hash, even
while the flusher thread is still sending counts it took a moment earlier (a scrape right after
a request must see that request)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from ndstore.storage.redis_metrics import KEY, RedisMetrics
from tests.conftest import _redis_server


@pytest.fixture
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    for url in _redis_server(tmp_path_factory, "metrics-redis"):  # a server of its own: the test pauses it
        yield redis.Redis.from_url(url)


def test_a_flush_returns_only_after_a_flush_already_under_way(client: redis.Redis) -> None:
    metrics = RedisMetrics(client)
    metrics.count("requests_total", route="CutoutView")
    client.client_pause(600, all=False)  # writes wait (HINCRBYFLOAT); reads go on
    earlier = threading.Thread(target=metrics.flush)
    earlier.start()
    deadline = time.monotonic() + 5
    while metrics._pending and time.monotonic() < deadline:  # the earlier flush has taken the count
        time.sleep(0.01)
    assert not metrics._pending
    assert metrics.flush() is True
    assert any(b"requests_total" in field for field in client.hgetall(KEY)), "flush() returned before the count"
    earlier.join(5)
