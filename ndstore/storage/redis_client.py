"""Redis clients tuned for large values: hiredis parses replies, the Python packer sends them,
and the replies' segments are acknowledged at once.

hiredis' command packer copies every value into one buffer, which made MSET/HSET of 256 KiB
cuboids 4-8x slower here; redis-py's Python packer sends large values as separate chunks.

A reply of many MiB (a supercuboid's cuboids) stalled now and then for 60-120 ms over loopback
TCP: Linux delays a receiver's ACKs (its delayed-ACK timer, 40 ms and up) when it takes the
connection for an interactive one, as a client that sends a command and reads its reply is;
Redis then found its send buffer full and waited while this client waited in recv for data
(strace of both sides; docs/design/serving.md, "Redis commands and replies"). Setting TCP_QUICKACK before each
read makes the kernel acknowledge what arrived at once. It is not sticky (the kernel returns to
delayed ACKs by itself), hence before every read: one setsockopt, ~1 us.

Each read takes up to READ_SIZE bytes: with redis-py's 64 KiB a supercuboid's reply came in ~455
reads of ~32 KiB, each a recv and a setsockopt that sends an ACK; with 256 KiB in ~87, and its
read took a quarter less CPU (the same section of serving.md). The buffer is one per connection.

Every call is bounded: a socket timeout on connect, send and each read (`timeout_s`), and one
Breaker per server (ndstore/core/stalls.py) that every client of the process shares: a call that
times out marks the server stalled, and calls to it then fail at once (RedisStalled, a
ConnectionError, which the adapters answer as a StorageError: 503) instead of each holding a
thread for the timeout.
"""

from __future__ import annotations

import socket
from typing import Any

import redis
from redis._parsers.hiredis import _HiredisParser
from redis.cluster import RedisCluster
from redis.connection import Connection, PythonRespSerializer

from ndstore.core.stalls import Breaker, Stalled, breaker

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class QuickAckParser(_HiredisParser):
    """redis-py's hiredis parser, with TCP_QUICKACK set on the socket before each read."""

    def read_from_socket(self, *args: Any, **kwargs: Any) -> Any:
        sock = self._sock
        if _QUICKACK is not None and sock is not None:  # a TCP socket: unix:// URLs take redis-py's own connection
            try:
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass  # the socket is going away: the read below says so
        return super().read_from_socket(*args, **kwargs)  # type: ignore[no-untyped-call]


READ_SIZE = 256 * 1024


class RedisStalled(redis.exceptions.ConnectionError):
    """Not sent: the server did not answer a recent call within its timeout."""


class LargeValueConnection(Connection):
    def __init__(self, breaker: Breaker | None = None, **kwargs: Any):
        kwargs.setdefault("parser_class", QuickAckParser)
        kwargs.setdefault("socket_read_size", READ_SIZE)
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self._breaker = breaker

    def _construct_command_packer(self, packer: Any) -> Any:
        return packer or PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)

    def _admit(self) -> None:
        if self._breaker is not None:
            try:
                self._breaker.admit(float(self.socket_timeout or 0) + 1)
            except Stalled as exc:
                raise RedisStalled(str(exc)) from None

    def _timed_out(self, exc: Exception) -> None:
        if self._breaker is not None:
            self._breaker.failed(f"no answer within {self.socket_timeout:g} s: {exc}")

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().connect_check_health(*args, **kwargs)
        except redis.exceptions.TimeoutError as exc:
            self._timed_out(exc)
            raise

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._admit()
        try:
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]
        except redis.exceptions.TimeoutError as exc:
            self._timed_out(exc)
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = super().read_response(*args, **kwargs)
        except redis.exceptions.TimeoutError as exc:
            self._timed_out(exc)
            raise
        if self._breaker is not None:
            self._breaker.answered()
        return response


CLUSTER_SCHEME = "redis+cluster://"


DEFAULT_TIMEOUT_S = 3.0  # = Config.redis_timeout_s's default (the service passes its Config's)


def connect(url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> redis.Redis:
    """A client for ``url``: `redis://host:port/db` for one node, `redis+cluster://host:port`
    (any node of the cluster) for Redis Cluster, whose every connect, send and read gives up after
    ``timeout_s``. One node uses LargeValueConnection and its server's Breaker; redis-py's cluster
    client takes no connection class, so a Cluster uses its default packer and no Breaker."""
    timeouts: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if url.startswith(CLUSTER_SCHEME):
        host, _, port = url[len(CLUSTER_SCHEME):].rstrip("/").partition(":")
        return RedisCluster(host=host, port=int(port or 6379), socket_read_size=READ_SIZE,  # type: ignore[return-value]
                            **timeouts)
    pool = redis.ConnectionPool.from_url(url, connection_class=LargeValueConnection, **timeouts)
    if pool.connection_class is LargeValueConnection:  # unix:// URLs take redis-py's own
        kwargs = pool.connection_kwargs
        address = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        kwargs["breaker"] = breaker(f"redis:{address}", f"the Redis at {address}")
    return redis.Redis(connection_pool=pool)
