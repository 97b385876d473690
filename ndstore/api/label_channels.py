"""Which channels the label index serves: every annotation channel, registered when it is
created (in its creating transaction, before any write can reach it), and the annotation
channels of an older release registered, incomplete, by `ndstore_prepare` and rebuilt by
`ndstore reindex --labels` (docs/design/label-index.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ndstore.api import lookups
from ndstore.api.models import Channel
from ndstore.core.keys import VolumeKey
from ndstore.wiring import services


def prefix_of(chan: Channel) -> str:
    """The channel's supercuboid name prefix (`ChannelVolume.name_prefix`) without its frame."""
    return VolumeKey(chan.experiment.collection_id, chan.experiment_id, chan.id, 0, 0).channel_prefix


def annotation_prefixes(channels: Iterable[Channel] | None = None) -> list[str]:
    """The prefixes of every annotation channel (or of those given that are)."""
    chosen = Channel.objects.select_related("experiment") if channels is None else channels
    return [prefix_of(c) for c in chosen if c.type == "annotation"]


def registered_when_created(sender: Any, instance: Channel, created: bool, **_: Any) -> None:
    """post_save of a Channel: a new annotation channel is served from the label index from its
    first write (complete: it holds nothing yet). A label index that cannot be reached fails the
    create (503), rolling it back: no annotation channel exists unregistered."""
    if created and instance.type == "annotation" and (labels := services().labels) is not None:
        labels.register([prefix_of(instance)], complete=True)
        if (products := services().products) is not None:  # its segmentation products kept from its first write
            products.describe(lookups.product_spec(instance))


def register_older(say: Any) -> None:
    """Every annotation channel not registered yet (made by a release without the label index,
    or while it was off) registered, incomplete: their stores are indexed from now on, and
    `ndstore reindex --labels` indexes what they stored before."""
    labels = services().labels
    if labels is None:
        return
    prefixes = annotation_prefixes()
    labels.register(prefixes, complete=False)
    waiting = [p for p in prefixes if not labels.serves(p)]
    if waiting:
        say(f"LABEL INDEX: {len(waiting)} annotation channels are not indexed yet; ids and boundingbox read their "
            "voxels until an operator runs `ndstore reindex --labels`")
