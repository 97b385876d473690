"""The levels a channel's views advertise: those that hold data (the data plane's record,
ndstore/engine/levels.py), so a viewer zoomed out on a declared but never built level does not
show black.

Channel.written_levels is the record as it was kept before it moved next to the voxels: one bit
per level, set by writes and builds that finished before then. It is read, never written: a level
it marks counts as built too.
"""

from __future__ import annotations

from ndstore.api.models import Channel
from ndstore.engine.volume import ChannelVolume
from ndstore.wiring import services


def built_levels(chan: Channel, volume: ChannelVolume) -> list[int]:
    marked = set(services().plane.levels.built(volume))
    legacy = {level for level in range(volume.num_levels) if chan.written_levels >> level & 1}
    return sorted(marked | legacy)


def note_hierarchy_built(volume: ChannelVolume) -> None:
    """After a build of every level finished (a run the service watched, the Spark build, the demo)."""
    services().plane.levels.note_all_built(volume)
