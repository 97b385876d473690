"""Which resolution levels of a channel hold data, so the views advertise only those: a level
that is declared but never built reads as black, and a viewer zoomed out on it shows nothing.

A level is marked built by the first write to it (the data plane marks it on every write path)
and every level by a finished build of the hierarchy (the queue-driven run marks them when its
last task completes, wherever that task runs: a web worker, the local runner or a Lambda; the
Spark build when it returns). Level 0, the base, always counts. A build in progress, cancelled
or failed marks nothing: its levels are partial.

The record is the port `LevelRecord`; `StoredLevels` keeps it in the object store, which every
process that writes voxels reaches: one empty object per built level, named so that marking is
an idempotent PUT (two workers marking two levels at once cannot undo each other) and reading
is one batched GET of the levels not yet known built. A level only ever becomes built (a
channel's marks go when the channel is deleted), so what a process has seen built it keeps; what
it has seen unbuilt it asks again after `recheck_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from ndstore.engine.volume import ChannelVolume
from ndstore.storage.interfaces import ObjectStore

MARK_PREFIX = "_ndstore-level&"  # not a supercuboid key: reindex and channel listings pass over it


class LevelRecord(Protocol):
    """Which levels of a channel hold data."""

    def built(self, channel: ChannelVolume) -> list[int]:
        """The built levels, ascending; 0 always."""

    def note_written(self, channel: ChannelVolume, level: int) -> None:
        """A write to `level` was acknowledged: the level holds data."""

    def note_all_built(self, channel: ChannelVolume) -> None:
        """A build of the whole hierarchy finished."""

    def forget(self, channel: ChannelVolume) -> None:
        """The channel's voxels were deleted."""


class StoredLevels:
    def __init__(self, objects: ObjectStore, recheck_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.objects = objects
        self.recheck_s = recheck_s
        self._clock = clock
        self._known: dict[str, set[int]] = {}  # channel prefix -> levels seen built
        self._asked: dict[str, float] = {}  # channel prefix -> when unbuilt levels were last asked
        self._guard = threading.Lock()

    @staticmethod
    def _key(channel: ChannelVolume, level: int) -> str:
        return f"{MARK_PREFIX}{channel.name_prefix}{level}"

    def built(self, channel: ChannelVolume) -> list[int]:
        prefix = channel.name_prefix
        with self._guard:
            known = set(self._known.get(prefix, ())) | {0}
            fresh = self._clock() - self._asked.get(prefix, float("-inf")) < self.recheck_s
        unknown = [level for level in range(channel.num_levels) if level not in known]
        if unknown and not fresh:
            keys = {self._key(channel, level): level for level in unknown}
            found = {keys[key] for key, body in self.objects.get_many(list(keys)) if body is not None}
            with self._guard:
                self._known.setdefault(prefix, set()).update(found)
                self._asked[prefix] = self._clock()
            known |= found
        return sorted(level for level in known if level < channel.num_levels)

    def note_written(self, channel: ChannelVolume, level: int) -> None:
        if level == 0 or level in self._known.get(channel.name_prefix, ()):
            return
        self._mark(channel, [level])

    def note_all_built(self, channel: ChannelVolume) -> None:
        self._mark(channel, range(1, channel.num_levels))

    def _mark(self, channel: ChannelVolume, levels: range | list[int]) -> None:
        if levels:
            self.objects.put_many({self._key(channel, level): b"" for level in levels})
        with self._guard:
            self._known.setdefault(channel.name_prefix, set()).update(levels)

    def forget(self, channel: ChannelVolume) -> None:
        self.objects.delete_many([self._key(channel, level) for level in range(1, channel.num_levels)])
        with self._guard:
            self._known.pop(channel.name_prefix, None)
            self._asked.pop(channel.name_prefix, None)
