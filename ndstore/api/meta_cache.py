"""What the hot paths look up in the metadata database on every request — a token's user, a
channel's path, a user's access level on it — kept per process while the metadata generation
(storage/generation.py) they were read under is current, and never longer than MAX_AGE_S.

Every save or delete of a resource, grant, token or user advances the generation (signals.py:
at once, and again when its transaction commits, so a worker that re-read the old rows in
between drops them too). A change made behind Django's back (raw SQL) is seen within MAX_AGE_S.
Without the generation's Redis, lookups go to the database every time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ndstore.core.errors import StorageError
from ndstore.wiring import metadata_generation

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_AGE_S = 10.0
MAX_ENTRIES = 10_000

_entries: dict[Hashable, tuple[int, float, Any]] = {}
_guard = threading.Lock()


def cached(key: Hashable, load: Callable[[], T], clock: Callable[[], float] = time.monotonic) -> T:
    """``load()``, or what it returned before under the current generation. Exceptions (a
    resource that does not exist) are not cached."""
    try:
        generation = metadata_generation().current()
    except StorageError as exc:
        log.warning("metadata cache bypassed: %s", exc)
        return load()
    now = clock()
    with _guard:
        hit = _entries.get(key)
    if hit is not None and hit[0] == generation and now - hit[1] < MAX_AGE_S:
        return hit[2]  # type: ignore[no-any-return]
    value = load()
    with _guard:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[key] = (generation, now, value)
    return value


def clear() -> None:
    with _guard:
        _entries.clear()
