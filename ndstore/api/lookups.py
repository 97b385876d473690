"""Resolve URL names to resources and resources to the engine's ChannelVolume."""

from __future__ import annotations

import numpy as np

from ndstore.api import meta_cache
from ndstore.api.models import Channel, Collection, CoordinateFrame, Experiment
from ndstore.core import precomputed
from ndstore.core.errors import NotFound
from ndstore.core.geometry import Box
from ndstore.engine.segments.upkeep import ProductSpec
from ndstore.engine.volume import ChannelVolume


def collection(name: str) -> Collection:
    found = Collection.objects.filter(name=name).first()
    if found is None:
        raise NotFound(f"collection {name!r} does not exist")
    return found


def experiment(coll: Collection, name: str) -> Experiment:
    found = Experiment.objects.select_related("coord_frame", "collection").filter(collection=coll, name=name).first()
    if found is None:
        raise NotFound(f"experiment {coll.name}/{name} does not exist")
    return found


def channel(exp: Experiment, name: str) -> Channel:
    found = Channel.objects.filter(experiment=exp, name=name).first()
    if found is None:
        raise NotFound(f"channel {exp.collection.name}/{exp.name}/{name} does not exist")
    return found


def channel_path(collection_name: str, experiment_name: str, channel_name: str) -> tuple[Collection, Experiment,
                                                                                           Channel]:
    """collection/experiment/channel in one query (the cutout hot path); when that finds
    nothing, step by step, so the 404 names the first that does not exist."""
    found = meta_cache.cached(
        ("channel", collection_name, experiment_name, channel_name),
        lambda: (Channel.objects.select_related("experiment__collection", "experiment__coord_frame")
                 .filter(name=channel_name, experiment__name=experiment_name,
                         experiment__collection__name=collection_name).first()))
    if found is None:
        coll = collection(collection_name)
        exp = experiment(coll, experiment_name)
        return coll, exp, channel(exp, channel_name)
    return found.experiment.collection, found.experiment, found


def coord_frame(name: str) -> CoordinateFrame:
    found = CoordinateFrame.objects.filter(name=name).first()
    if found is None:
        raise NotFound(f"coordinate frame {name!r} does not exist")
    return found


def channel_volume(chan: Channel) -> ChannelVolume:
    exp = chan.experiment
    f = exp.coord_frame
    frame = Box((f.x_start, f.y_start, f.z_start), (f.x_stop, f.y_stop, f.z_stop))
    return ChannelVolume(
        collection_id=exp.collection_id,
        experiment_id=exp.id,
        channel_id=chan.id,
        dtype=np.dtype(chan.datatype),
        frame=frame,
        num_levels=exp.num_hierarchy_levels,
        method=exp.hierarchy_method,  # type: ignore[arg-type]
        num_time_samples=exp.num_time_samples,
        write_through=chan.cache_write_through,
        annotation=chan.type == "annotation",
    )


def product_spec(chan: Channel) -> ProductSpec:
    """What a rebuild of a label channel's segmentation products needs: its geometry and voxel size in nm."""
    frame = chan.experiment.coord_frame
    voxel_nm = precomputed.voxel_size_nm((frame.x_voxel_size, frame.y_voxel_size, frame.z_voxel_size),
                                         frame.voxel_unit)
    return ProductSpec(channel_volume(chan), voxel_nm)
