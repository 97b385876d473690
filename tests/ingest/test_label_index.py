"""Ingest reaches the base tier through the same store as every other write path: a label
channel's supercuboids are in its label index, with their voxel counts, as the pipeline builds
them (moto's S3, SQS and DynamoDB, the local runner's poller)."""

from __future__ import annotations

import pytest

from ndstore.core.labels import label_counts
from tests.ingest.conftest import Pipeline, all_cleaned, make_job, source_volume

pytestmark = pytest.mark.usefixtures("ingest_env")


def test_an_ingested_label_channel_is_indexed_as_it_is_built() -> None:
    from ndstore.wiring import services

    svc = services()
    assert svc.labels is not None
    job = make_job()
    svc.labels.register([job.channel.name_prefix], complete=True)  # as its creation does
    svc.ingest.create(job)
    pipeline = Pipeline(svc.ingest, job, source_volume())
    assert pipeline.upload() == 72
    pipeline.run(all_cleaned)
    volume, grid = job.channel.volume_key(0, 0), job.channel.grid(0)
    keys = [volume.supercuboid(m) for m in svc.index.mortons(volume)]
    truth = {}
    for key in keys:
        labels, voxels = label_counts(svc.cache_tier._base.read_supercuboid(key, grid, job.channel.dtype))
        truth[key] = dict(zip(labels.tolist(), voxels.tolist()))
    assert len(keys) == 3 and all(len(t) > 100 for t in truth.values())
    assert svc.labels.labels_of(keys) == truth
    assert svc.labels.unsettled(volume) == set()
