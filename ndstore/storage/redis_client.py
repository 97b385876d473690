"""Redis clients tuned for large values: hiredis parses replies, the Python packer sends them.

hiredis' command packer copies every value into one buffer, which made MSET/HSET of 256 KiB
cuboids 4-8x slower here; redis-py's Python packer sends large values as separate chunks.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.connection import Connection, PythonRespSerializer


class LargeValueConnection(Connection):
    def _construct_command_packer(self, packer: Any) -> Any:
        return packer or PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)


CLUSTER_SCHEME = "redis+cluster://"


def connect(url: str, socket_timeout: float | None = None) -> redis.Redis:
    """A client for ``url``: `redis://host:port/db` for one node, `redis+cluster://host:port`
    (any node of the cluster) for Redis Cluster. One node uses LargeValueConnection; redis-py's
    cluster client takes no connection class, so a Cluster uses its default packer.
    ``socket_timeout`` replaces redis-py's default (5 s) where single values are very large."""
    timeouts: dict[str, Any] = {} if socket_timeout is None else {"socket_timeout": socket_timeout}
    if url.startswith(CLUSTER_SCHEME):
        host, _, port = url[len(CLUSTER_SCHEME):].rstrip("/").partition(":")
        return RedisCluster(host=host, port=int(port or 6379), **timeouts)  # type: ignore[return-value]
    pool = redis.ConnectionPool.from_url(url, connection_class=LargeValueConnection, **timeouts)
    return redis.Redis(connection_pool=pool)
