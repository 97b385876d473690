"""Django's PostgreSQL backend with every call to the metadata database bounded in time, as
every Redis and object store call is: a stalled database costs the requests that need it a fast
503, never a web worker's threads for as long as the stall lasts. The settings name this backend
(`ENGINE: ndstore.api.postgres`) wherever DATABASE_URL is a PostgreSQL URL.

libpq has no timeout for a query on an open connection (`connect_timeout` bounds only the
connect, and TCP keepalives do not fire while the server's kernel still acknowledges), so a
watchdog thread shuts down the socket of a query still running after NDSTORE_DB_TIMEOUT_S: the
query fails at once with an OperationalError and Django drops the connection. A connect or a
query that ran out of time marks the database's Breaker (ndstore/core/stalls.py) stalled, and the
next connects and queries of the process fail at once until one gets through.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import OperationalError
from django.db.backends.postgresql import base

from ndstore.core.stalls import Stalled, breaker

_breaker = breaker("database", "the metadata database")


class _Watchdog:
    """One thread that shuts down the sockets of queries past their deadline."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, int]] = []  # (deadline, ticket, socket fd)
        self._armed: set[int] = set()
        self._fired: set[int] = set()
        self._tickets = itertools.count()
        self._guard = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> int:
        with self._guard:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="ndstore-db-deadline")
                self._thread.start()
            ticket = next(self._tickets)
            self._armed.add(ticket)
            heapq.heappush(self._due, (time.monotonic() + seconds, ticket, fd))
            self._guard.notify()
            return ticket

    def disarm(self, ticket: int) -> bool:
        """Whether the deadline had passed (and the socket was shut down)."""
        with self._guard:
            self._armed.discard(ticket)
            fired = ticket in self._fired
            self._fired.discard(ticket)
            return fired

    def _run(self) -> None:
        while True:
            with self._guard:
                while self._due and self._due[0][1] not in self._armed:
                    heapq.heappop(self._due)  # answered in time
                wait = self._due[0][0] - time.monotonic() if self._due else None
                if wait is None or wait > 0:
                    self._guard.wait(wait)
                    continue
                _, ticket, fd = heapq.heappop(self._due)
                self._fired.add(ticket)
                _shut_down(fd)  # under the guard: the query cannot finish and close the fd meanwhile


def _shut_down(fd: int) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile


_watchdog = _Watchdog()


def _admit(timeout_s: float) -> None:
    try:
        _breaker.admit(timeout_s + 1)
    except Stalled as exc:
        raise OperationalError(str(exc)) from None


def bounded(timeout_s: float) -> Callable[..., Any]:
    """An execute wrapper (Django's `connection.execute_wrapper`) bounding each query."""

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        _admit(timeout_s)
        ticket = _watchdog.arm(context["connection"].connection.fileno(), timeout_s)
        try:
            result = run(sql, params, many, context)
        except OperationalError as exc:
            if _watchdog.disarm(ticket):
                _breaker.failed(f"a query had no answer within {timeout_s:g} s")
                raise OperationalError(f"the metadata database did not answer within {timeout_s:g} s") from exc
            raise
        _watchdog.disarm(ticket)
        _breaker.answered()
        return result

    return execute


class DatabaseWrapper(base.DatabaseWrapper):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.timeout_s = float(settings.CONFIG.db_timeout_s)
        self.execute_wrappers.append(bounded(self.timeout_s))

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        params.setdefault("connect_timeout", max(1, round(self.timeout_s)))
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        _admit(self.timeout_s)
        started = time.monotonic()
        try:
            connection = super().get_new_connection(conn_params)
        except Exception:
            if time.monotonic() - started >= self.timeout_s * 0.9:
                _breaker.failed(f"a connect had no answer within {self.timeout_s:g} s")
            raise
        _breaker.answered()
        return connection
