"""Counting the requests a thread sends to Redis, for tests that say how many round trips a call takes."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis


class RoundTrips:
    """Requests this thread sends to Redis (a pipeline is one), counted at redis-py's socket."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count, thread = 0, threading.get_ident()
        send = redis.connection.AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            if threading.get_ident() == thread:
                self.count += 1
            send(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def during(self, fn: Any) -> tuple[int, Any]:
        before = self.count
        result = fn()
        return self.count - before, result
