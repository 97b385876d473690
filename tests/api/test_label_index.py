"""The label index through the API, on the real adapters (DynamoDB and S3 over moto's server):
an annotation channel is served from its creation, `ids` and `boundingbox` answer from it what
the voxels say, `ndstore reindex --labels` repairs lost entries and indexes the channels of an
older release (registered by the next start), checked against the voxels read back."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from django.core.management import call_command
from rest_framework.test import APIClient

from ndstore.core.errors import StorageError
from tests.api.conftest import make_dataset

OCTET = "application/octet-stream"
TOP = 2**64 - 1
FRAME = (1100, 700, 20)


def prefix(channel: str) -> str:
    from ndstore.api.label_channels import prefix_of
    from ndstore.api.models import Channel

    return prefix_of(Channel.objects.get(name=channel))


def labelled(admin: APIClient, name: str = "lx") -> np.ndarray:
    """A label channel `ann` over two supercuboids in x and three levels, labels 5, 2^63 and
    2^64-1 written through the cache tier, NDBlaze and direct I/O. Returns level 0's voxels."""
    make_dataset(admin, name, frame=FRAME, levels=3, channels={"img8": "uint8", "ann": "uint64"})
    voxels = np.zeros(FRAME[::-1], np.uint64)
    for path, (x0, x1), label in (("/v1/cutout", (10, 90), 5), ("/v1/blaze/cutout", (500, 530), 2**63),
                                  ("/v1/direct/cutout", (700, 1000), TOP)):
        data = np.full((4, 30, x1 - x0), label, np.uint64)
        r = admin.post(f"{path}/{name}/e1/ann/0/{x0}:{x1}/100:130/2:6/", data.tobytes(), content_type=OCTET)
        assert r.status_code == 201, r.content
        voxels[2:6, 100:130, x0:x1] = label
    return voxels


def read_back(admin: APIClient, name: str = "lx") -> np.ndarray:
    r = admin.get(f"/v1/cutout/{name}/e1/ann/0/0:{FRAME[0]}/0:{FRAME[1]}/0:{FRAME[2]}/", HTTP_ACCEPT=OCTET)
    assert r.status_code == 200
    return np.frombuffer(r.content, np.uint64).reshape(FRAME[::-1])


def answers(admin: APIClient, voxels: np.ndarray, name: str = "lx") -> None:
    """ids over the whole level and each label's boundingbox, as the voxels have them."""
    r = admin.get(f"/v1/ids/{name}/e1/ann/0/0:{FRAME[0]}/0:{FRAME[1]}/0:{FRAME[2]}/")
    present = sorted(set(np.unique(voxels).tolist()) - {0})
    assert r.status_code == 200 and r.json() == {"ids": [str(i) for i in present]}, r.content
    for label in present:
        z, y, x = np.nonzero(voxels == label)
        box = admin.get(f"/v1/boundingbox/{name}/e1/ann/0/{label}/?type=tight")
        assert box.json() == {"x_range": [int(x.min()), int(x.max()) + 1], "y_range": [int(y.min()), int(y.max()) + 1],
                              "z_range": [int(z.min()), int(z.max()) + 1], "t_range": [0, 1]}, (label, box.content)


def test_an_annotation_channel_is_served_from_its_creation(admin: APIClient) -> None:
    from ndstore.wiring import services

    voxels = labelled(admin)
    labels = services().labels
    assert labels is not None
    assert labels.serves(prefix("ann")) and labels.index.channel(prefix("img8")) is None
    answers(admin, voxels)
    assert np.array_equal(read_back(admin), voxels)
    # in the base tier's entries: the direct write, the cached one (ids wrote it back), and the
    # NDBlaze one once merged (until then ids and boundingbox read it where it is pending)
    def entries() -> set[int]:
        return {label for counts in labels.labels_of(labels.index.indexed(prefix("ann"))).values() for label in counts}

    assert entries() == {5, TOP}
    svc = services()
    assert svc.merger.merge(svc.blaze_buffer.pending_names()).supercuboids == 2
    assert entries() == {5, 2**63, TOP}
    answers(admin, voxels)


def test_an_unreachable_label_index_refuses_the_channel_whole(admin: APIClient,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No annotation channel exists that its label index does not know: the create is a 503 and
    rolled back."""
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    make_dataset(admin, "lu", channels={"img8": "uint8"})
    labels = services().labels
    assert labels is not None

    def away(*_: Any, **__: Any) -> list[str]:
        raise StorageError("the label index cannot be reached")

    monkeypatch.setattr(labels, "register", away)
    r = admin.post("/v1/collection/lu/experiment/e1/channel/ann/", {"type": "annotation", "datatype": "uint64"},
                   format="json")
    assert r.status_code == 503, r.content
    assert not Channel.objects.filter(name="ann").exists()
    monkeypatch.undo()
    r = admin.post("/v1/collection/lu/experiment/e1/channel/ann/", {"type": "annotation", "datatype": "uint64"},
                   format="json")
    assert r.status_code == 201 and labels.serves(prefix("ann"))


def test_reindex_labels_repairs_lost_entries(admin: APIClient) -> None:
    from ndstore.ops.cli import commands
    from ndstore.wiring import services

    voxels = labelled(admin)
    svc = services()
    svc.merger.merge(svc.blaze_buffer.pending_names())
    answers(admin, voxels)  # the cached write written back: every entry in the index
    labels = svc.labels
    assert labels is not None
    stored = labels.index.indexed(prefix("ann"))
    labels.index.settle({k: list(c) for k, c in labels.labels_of(stored).items()})  # every entry lost
    r = admin.get(f"/v1/ids/lx/e1/ann/0/0:{FRAME[0]}/0:{FRAME[1]}/0:{FRAME[2]}/")
    assert r.json() == {"ids": []}  # the box covers every supercuboid: the index answers alone

    done = CliRunner().invoke(commands, ["reindex", "--labels"])
    assert done.exit_code == 0 and "label index rebuilt: 1 annotation channels" in done.output, done.output
    answers(admin, read_back(admin))
    answers(admin, voxels)


def test_an_older_channel_is_registered_at_start_and_indexed_by_reindex(admin: APIClient,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A release without the label index made the channel and wrote it: the next start
    registers it, incomplete (ids and boundingbox scan voxels and say so at start), and
    `reindex --labels` indexes it."""
    from ndstore.ops.cli import commands
    from ndstore.wiring import services

    labels = services().labels
    assert labels is not None
    monkeypatch.setattr(labels, "unknown_ttl_s", 0.0)
    monkeypatch.setattr(labels, "register", lambda *_, **__: [])  # as an older release: nothing registered
    voxels = labelled(admin, "lo")
    monkeypatch.undo()
    monkeypatch.setattr(labels, "unknown_ttl_s", 0.0)
    assert labels.index.channel(prefix("ann")) is None and labels.index.indexed(prefix("ann")) == []

    said = io.StringIO()
    call_command("ndstore_prepare", stderr=said, stdout=io.StringIO())  # the next start
    assert "LABEL INDEX: 1 annotation channels are not indexed yet" in said.getvalue()
    assert labels.index.channel(prefix("ann")) is False
    answers(admin, voxels, "lo")  # scanned meanwhile

    done = CliRunner().invoke(commands, ["reindex", "--labels"])
    assert done.exit_code == 0 and "1 annotation channels are not indexed yet" in done.output, done.output
    assert labels.serves(prefix("ann"))
    answers(admin, voxels, "lo")
    said = io.StringIO()
    call_command("ndstore_prepare", stderr=said, stdout=io.StringIO())
    assert "LABEL INDEX" not in said.getvalue()


def test_a_deleted_label_channel_leaves_no_entry(admin: APIClient) -> None:
    """Every entry and mark of a deleted channel goes, those of a write that died before its
    object was put too: a later channel given its id (a restored database) starts empty."""
    from ndstore.api.lookups import channel_volume
    from ndstore.api.models import Channel
    from ndstore.wiring import services

    labelled(admin, "ld")
    services().cache_tier.upkeep.flush_all()  # the cached write in the base tier (the NDBlaze one stays pending)
    labels = services().labels
    assert labels is not None
    volume = channel_volume(Channel.objects.get(name="ann")).volume_key(2, 0)
    labels.index.begin({volume.supercuboid(3): {42: 1}}, "writing")  # died before its object was put
    ours = prefix("ann")
    assert len(labels.index.indexed(ours)) == 3
    assert admin.delete("/v1/collection/ld/experiment/e1/channel/ann/").status_code == 204
    assert labels.index.indexed(ours) == []
