"""What a process knows of each dependency it calls (a Redis server, the metadata database, the
object store): answering, or stalled. A call that ran into its timeout (for an endpoint with
many servers behind it, such as S3: that many calls in a row with no answer in between) marks
the dependency stalled for STALLED_S; until then every call to it fails at once (a fast 503) instead of each
waiting out its own timeout with a web worker's thread. After that one call at a time goes
through as a probe: an answer clears the mark, another timeout renews it.

The adapters own the calls and their timeouts; this module owns only the state, so that every
client of one server (a Redis shared by the cache and the locks, a health probe) sees one mark.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ndstore.core.errors import StorageError

STALLED_S = 2


class Stalled(StorageError):
    """A call refused without being tried: its dependency did not answer a recent call in time."""

    retry_after_s = round(STALLED_S)  # whole seconds: Retry-After


class Breaker:
    """One dependency's state as this process sees it."""

    def __init__(self, name: str, stalled_s: float = STALLED_S, timeouts: int = 1,
                 clock: Callable[[], float] = time.monotonic):
        """``timeouts``: how many calls in a row must run into their timeout to mark it stalled."""
        self.name = name
        self.stalled_s = stalled_s
        self.timeouts = timeouts
        self._in_a_row = 0
        self._clock = clock
        self._until = 0.0  # calls fail at once before this time
        self._probe_until = 0.0  # a probe is out until this time: others still fail at once
        self._prober = 0  # the thread whose calls are the probe (a call may take several sends)
        self._why = ""
        self._guard = threading.Lock()

    def admit(self, probe_s: float) -> None:
        """Raise Stalled unless a call may go now. Past the stall, the first caller goes as the
        probe (for at most ``probe_s``, its own timeout); the others wait for its outcome."""
        if not self._until:
            return  # answering: the common case costs one attribute read
        now, me = self._clock(), threading.get_ident()
        with self._guard:
            if not self._until or (self._prober == me and now < self._probe_until):
                return
            if now >= self._until and now >= self._probe_until:
                self._probe_until, self._prober = now + probe_s, me
                return
        raise Stalled(f"{self.name} is not answering ({self._why}); calls to it fail at once for up to "
                      f"{self.stalled_s:g} s at a time until it answers again")

    def failed(self, why: str) -> None:
        """A call ran into its timeout: stalled for the next stalled_s (once `timeouts` did)."""
        with self._guard:
            self._in_a_row += 1
            if self._in_a_row < self.timeouts:
                return
            self._until = self._clock() + self.stalled_s
            self._probe_until, self._prober = 0.0, 0
            self._why = why

    def answered(self) -> None:
        self._in_a_row = 0
        if self._until:
            with self._guard:
                self._until = self._probe_until = 0.0
                self._prober = 0

    @property
    def stalled(self) -> bool:
        return bool(self._until)


_breakers: dict[str, Breaker] = {}
_registry_guard = threading.Lock()


def breaker(key: str, name: str, timeouts: int = 1) -> Breaker:
    """The process's one Breaker of the dependency at ``key`` (an address), named ``name`` in
    messages by whoever asked for it first."""
    with _registry_guard:
        found = _breakers.get(key)
        if found is None:
            found = _breakers[key] = Breaker(name, timeouts=timeouts)
        return found
