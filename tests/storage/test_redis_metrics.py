"""RedisMetrics.flush(): when it returns, every count made before it is in the shared hash, even
while the flusher thread is still sending counts it took a moment earlier (a scrape right after
a request must see that request)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from ndstore.storage.redis_metrics import FLUSH_S, KEY, RedisMetrics
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


def test_a_closed_recorder_is_flushed_and_no_longer_flushed_in_the_background(
        tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Whoever stops a recorder's Redis closes the recorder first (tests' fixtures do, through
    wiring.services.cache_clear()): the process's flusher thread must not then try that Redis."""
    server = _redis_server(tmp_path_factory, "metrics-redis-closed")
    try:
        client = redis.Redis.from_url(next(server))
        metrics = RedisMetrics(client)
        metrics.count("requests_total", route="CutoutView")
        assert metrics.close() is True
        assert any(b"requests_total" in field for field in client.hgetall(KEY)), "close() did not flush"
        metrics.count("requests_total", route="CutoutView")  # counted after close: kept, not sent
        next(server, None)  # the generator's teardown: the server stops
        with caplog.at_level("DEBUG", logger="ndstore.storage.redis_metrics"):
            time.sleep(FLUSH_S * 2.5)
        assert not [r for r in caplog.records if "not flushed" in r.getMessage()]
        assert metrics._pending, "a closed recorder's later counts were taken by the flusher"
    finally:
        next(server, None)  # stopped, if a failure left it running
