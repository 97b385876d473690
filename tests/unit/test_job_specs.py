"""Job specs travel as JSON (tile index rows, queue messages): they round-trip exactly."""

from __future__ import annotations

import numpy as np

from ndstore.core.geometry import Box
from ndstore.engine.downsample import DownsampleJob
from ndstore.engine.ingest import IngestJob
from ndstore.engine.volume import ChannelVolume

CHANNEL = ChannelVolume(3, 4, 5, np.dtype("uint16"), Box((0, 0, 0), (700, 600, 80)), 3, "isotropic", 2,
                        write_through=True, annotation=True)


def test_a_channel_volume_round_trips() -> None:
    assert ChannelVolume.from_dict(CHANNEL.to_dict()) == CHANNEL


def test_job_specs_round_trip() -> None:
    ingest = IngestJob(9, CHANNEL, ((0, 0, 0), (512, 512, 8)), 256, 256, 0, 2, "tif", "p")
    assert IngestJob.from_json(ingest.to_json()) == ingest
    downsample = DownsampleJob(10, CHANNEL, "p")
    assert DownsampleJob.from_json(downsample.to_json()) == downsample
