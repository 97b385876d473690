"""The demo dataset of `ndstore up --demo`: a public collection with synthetic EM-like uint8
imagery and a sparse uint64 annotation channel over it, every resolution level built (a viewer
zoomed out sees data, not black)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ndstore.api import levels, lookups
from ndstore.api.models import Channel, Collection, CoordinateFrame, Experiment, Grant
from ndstore.core import synthetic
from ndstore.core.geometry import Box
from ndstore.engine.dataplane import Write
from ndstore.engine.volume import ChannelVolume, make_cutout
from ndstore.wiring import services

DEMO_SHAPE_XYZ = (1024, 1024, 64)


def create_demo(admin: Any) -> bool:
    """Create the demo dataset unless it exists. Returns True when it was created."""
    if Collection.objects.filter(name="demo").exists():
        return False
    x, y, z = DEMO_SHAPE_XYZ
    frame = CoordinateFrame.objects.create(name="demo_frame", x_stop=x, y_stop=y, z_stop=z, x_voxel_size=4,
                                           y_voxel_size=4, z_voxel_size=40, creator=admin)
    coll = Collection.objects.create(name="demo", description="Synthetic EM demo", public=True, creator=admin)
    Grant.objects.create(user=admin, collection=coll, level="admin")
    exp = Experiment.objects.create(collection=coll, name="em", coord_frame=frame, num_hierarchy_levels=4,
                                    creator=admin)
    image = Channel.objects.create(experiment=exp, name="image", datatype="uint8", creator=admin)
    labels = Channel.objects.create(experiment=exp, name="labels", type="annotation", datatype="uint64",
                                    sources=["image"], creator=admin)
    box = Box((0, 0, 0), DEMO_SHAPE_XYZ)
    plane = services().plane
    limit = 1 << 40
    for chan, data in ((image, synthetic.em_like(box.shape_zyx, seed=1)),
                       (labels, synthetic.sparse_labels(box.shape_zyx, seed=2, dtype=np.uint64))):
        volume = lookups.channel_volume(chan)
        plane.write(make_cutout(volume, 0, box, range(0, 1), limit), data[np.newaxis], Write.DIRECT)
        build_every_level(chan, volume)
    return True


def build_every_level(chan: Channel, volume: ChannelVolume) -> None:
    """The hierarchy, here and now (the demo is small: seconds), as a downsample job would build it."""
    downsampler = services().downsampler
    for level in range(1, volume.num_levels):
        for parent in downsampler.manifest(volume, level):
            downsampler.build_parent(volume, parent)
    chan.downsample_status = "DOWNSAMPLED"
    chan.save(update_fields=["downsample_status"])
    levels.note_hierarchy_built(volume)
