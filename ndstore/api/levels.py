"""Which resolution levels of a channel hold data, so the views advertise only those: a level
that is declared but never built reads as black, and a viewer zoomed out on it shows nothing.

Channel.written_levels holds one bit per level: set for every level when a build of the
hierarchy finishes, and for one level by a client's first write to it; level 0, the base,
always counts. A build in progress, cancelled or failed sets nothing: its levels are partial.
"""

from __future__ import annotations

from django.db.models import F

from ndstore.api.models import Channel
from ndstore.api.signals import metadata_changed


def built_levels(chan: Channel, num_levels: int) -> list[int]:
    return [level for level in range(num_levels) if level == 0 or chan.written_levels >> level & 1]


def note_written(chan: Channel, level: int) -> None:
    """After a client's write to `level`: the first one marks the level built (one UPDATE, and
    the metadata generation advances so every worker's cached channel sees it)."""
    if level == 0 or chan.written_levels >> level & 1:
        return
    _mark(chan, 1 << level)


def note_hierarchy_built(chan: Channel, num_levels: int) -> None:
    """After a build of every level finished."""
    _mark(chan, (1 << num_levels) - 1)


def _mark(chan: Channel, bits: int) -> None:
    Channel.objects.filter(pk=chan.pk).update(written_levels=F("written_levels").bitor(bits))
    chan.written_levels |= bits
    metadata_changed()
