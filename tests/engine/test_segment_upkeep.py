"""Segmentation products kept current (ndstore/engine/segments/upkeep.py) on the wiring's local
default (a directory, SQLite files and queue, real Redis): a stored supercuboid of level 0 marks
its fragments and its low-side neighbours' stale and queues their rebuild; a rebuild reads the
supercuboid plus one voxel of overlap from the base tier, stores each kind's fragment object and
removes the mark unless a write marked it again meanwhile; a skipped supercuboid keeps its last
good fragment and says why; a purged channel's products go.

The builders here record what they were given (the cores have tests of their own, and
tests/api/test_segmentation.py runs the real ones end to end)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ndstore import wiring
from ndstore.core import morton
from ndstore.core.geometry import Box
from ndstore.core.segments.bounds import Skipped
from ndstore.engine.dataplane import Write
from ndstore.engine.segments.upkeep import STALE, ProductSpec, ProductUpkeep
from ndstore.engine.volume import ChannelVolume, make_cutout
from tests.engine.test_label_index import label_channel

LIMIT = 1 << 34
VOXEL_NM = (4.0, 4.0, 40.0)


class Recorder:
    """A builder that stores the labels and the block shape it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], Box]] = []
        self.fail_with: str | None = None
        self.during: Any = None

    def __call__(self, block: Any, box: Box, cell: Any, voxel_nm: Any, extent: Box) -> bytes | None:
        self.calls.append((block.shape, box))
        if self.during is not None:
            self.during()
        if self.fail_with:
            raise Skipped(self.fail_with)
        labels = sorted(set(np.unique(block).tolist()) - {0})
        return json.dumps({"labels": labels, "shape": list(block.shape)}).encode() if labels else None


@pytest.fixture
def products(svc: wiring.Services) -> tuple[ProductUpkeep, Recorder]:
    assert svc.products is not None
    recorder = Recorder()
    svc.products.builders = {"mesh": recorder}
    return svc.products, recorder


@pytest.fixture
def ch(svc: wiring.Services, products: tuple[ProductUpkeep, Recorder]) -> ChannelVolume:
    chan = label_channel()
    assert svc.labels is not None
    svc.labels.register([chan.name_prefix], complete=True)  # as the channel's creation does
    products[0].describe(ProductSpec(chan, VOXEL_NM))
    return chan


def write(svc: wiring.Services, ch: ChannelVolume, lo: tuple[int, int, int], hi: tuple[int, int, int],
          label: int) -> None:
    cutout = make_cutout(ch, 0, Box(lo, hi), range(0, 1), LIMIT)
    svc.plane.write(cutout, np.full(cutout.shape, label, ch.dtype), Write.DIRECT)


def stale(svc: wiring.Services, ch: ChannelVolume) -> set[tuple[int, int, int]]:
    prefix = f"{STALE}{ch.volume_key(0, 0).partition}&"
    return {morton.decode_one(int(k.rsplit("&", 1)[1])) for k in svc.objects.list_keys(prefix)}


def drain(products: ProductUpkeep) -> list[str]:
    """Every queued rebuild handled, in this process; returns the outcomes."""
    queue, url = products._products_queue()
    outcomes = []
    while messages := queue.queues.receive(url, 10, wait_s=0):
        for m in messages:
            outcomes.append(products.handle(m.body))
            queue.queues.delete_message(url, m.receipt)
    return outcomes


def test_a_write_marks_its_supercuboid_and_low_side_neighbours(svc: wiring.Services, ch: ChannelVolume,
                                                               products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, recorder = products
    sx, sy, sz = ch.grid(0).supercuboid
    write(svc, ch, (sx, 5, 1), (sx + 20, 15, 3), 7)  # in supercuboid (1, 0, 0), from its first plane
    assert stale(svc, ch) == {(1, 0, 0), (0, 0, 0)}
    assert sorted(drain(upkeep)) == ["built", "built"]
    assert stale(svc, ch) == set()
    shapes = {box.lo: shape for shape, box in recorder.calls}
    # (0, 0, 0): its box plus one voxel into (1, 0, 0) in x and into the next z supercuboid
    assert shapes[(0, 0, 0)] == (sz + 1, sy, sx + 1)
    assert shapes[(sx, 0, 0)] == (sz + 1, sy, sx)  # the extent ends at 2 * sx in x, sy in y
    volume = ch.volume_key(0, 0)
    stored = svc.fragments.get_many("mesh", [volume.supercuboid(0), volume.supercuboid(morton.encode_one(1, 0, 0))])
    assert [json.loads(b)["labels"] for b in stored.values()] == [[7], [7]]  # (0, 0, 0) from its overlap


def test_duplicate_messages_rebuild_once(svc: wiring.Services, ch: ChannelVolume,
                                         products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, recorder = products
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)
    write(svc, ch, (30, 5, 1), (40, 15, 3), 3)  # the same supercuboid again before any rebuild
    assert sorted(drain(upkeep)) == ["built", "fresh"]
    assert len(recorder.calls) == 1


def test_a_write_during_a_rebuild_keeps_the_mark(svc: wiring.Services, ch: ChannelVolume,
                                                 products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, recorder = products
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)
    recorder.during = lambda: (write(svc, ch, (50, 5, 1), (60, 15, 3), 4), setattr(recorder, "during", None))
    outcomes = drain(upkeep)
    assert outcomes.count("built") == 2, outcomes  # the second write's rebuild found its mark
    key = ch.volume_key(0, 0).supercuboid(0)
    assert json.loads(svc.fragments.get_many("mesh", [key])[key])["labels"] == [3, 4]
    assert stale(svc, ch) == set()


def test_a_skipped_supercuboid_keeps_its_last_good_fragment(svc: wiring.Services, ch: ChannelVolume,
                                                            products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, recorder = products
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)
    drain(upkeep)
    recorder.fail_with = "a million labels"
    write(svc, ch, (10, 5, 1), (20, 15, 3), 9)
    assert drain(upkeep) == ["skipped"]
    status = upkeep.status(ch.volume_key(0, 0))
    assert status["stale"] == 0
    assert status["skipped"] == [{"kind": "mesh", "supercuboid": ch.volume_key(0, 0).supercuboid(0).name,
                                  "reason": "a million labels"}]
    key = ch.volume_key(0, 0).supercuboid(0)
    assert json.loads(svc.fragments.get_many("mesh", [key])[key])["labels"] == [3]  # the last good one
    recorder.fail_with = None
    write(svc, ch, (10, 5, 1), (20, 15, 3), 5)
    drain(upkeep)
    assert upkeep.status(ch.volume_key(0, 0))["skipped"] == []


def test_status_reports_stale_supercuboids_and_their_lag(svc: wiring.Services, ch: ChannelVolume,
                                                         products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, _ = products
    sx, _, _ = ch.grid(0).supercuboid
    write(svc, ch, (sx + 1, 5, 1), (sx + 9, 15, 3), 11)
    status = upkeep.status(ch.volume_key(0, 0))
    assert status["stale"] == 2 and status["lag_s"] >= 0 and status["queue"]["waiting"] == 2
    assert upkeep.status(ch.volume_key(0, 0), 11)["stale"] == 2  # both may hold a piece of 11
    drain(upkeep)
    assert upkeep.status(ch.volume_key(0, 0), 11) == {"stale": 0, "lag_s": 0.0, "skipped": [],
                                                      "queue": {"waiting": 0, "in_flight": 0}}


def test_a_channel_without_a_spec_is_not_kept_until_built(svc: wiring.Services,
                                                          products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, recorder = products
    older = label_channel(cid=2)
    assert svc.labels is not None
    svc.labels.register([older.name_prefix], complete=True)
    write(svc, older, (10, 5, 1), (20, 15, 3), 3)
    assert stale(svc, older) == set()
    queued = upkeep.build_all(ProductSpec(older, VOXEL_NM), svc.index.mortons(older.volume_key(0, 0)), 0)
    assert queued == 1 and stale(svc, older) == {(0, 0, 0)}
    assert drain(upkeep) == ["built"]


def test_a_purge_forgets_the_products(svc: wiring.Services, ch: ChannelVolume,
                                      products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, _ = products
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)
    drain(upkeep)
    write(svc, ch, (10, 5, 1), (20, 15, 3), 4)  # stale again
    svc.plane.purge(ch)
    assert upkeep.forget(ch.name_prefix) >= 2
    assert [k for k in svc.objects.list_keys("_ndstore-seg&") if ch.name_prefix in k] == []
    assert set(drain(upkeep)) <= {"fresh"}


def test_marks_that_cannot_be_queued_do_not_fail_the_write(svc: wiring.Services, ch: ChannelVolume,
                                                           products: tuple[ProductUpkeep, Recorder],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    upkeep, _ = products

    def no_queue() -> Any:
        raise ConnectionError("the queue service is down")

    upkeep._queue_factory = no_queue
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)  # stored: the voxels stand
    cutout = make_cutout(ch, 0, Box((10, 5, 1), (20, 15, 3)), range(0, 1), LIMIT)
    assert (svc.plane.read(cutout) == 3).all()
    assert "marking the segmentation products" in caplog.text


def test_a_kind_skipped_is_reported_while_the_others_are_built(svc: wiring.Services, ch: ChannelVolume,
                                                               products: tuple[ProductUpkeep, Recorder]) -> None:
    upkeep, skipping = products
    skipping.fail_with = "too many boundary faces"
    building = Recorder()
    upkeep.builders = {"mesh": skipping, "skeleton": building}
    write(svc, ch, (10, 5, 1), (20, 15, 3), 3)
    assert drain(upkeep) == ["skipped"]
    key = ch.volume_key(0, 0).supercuboid(0)
    assert svc.fragments.get_many("mesh", [key]) == {}
    assert json.loads(svc.fragments.get_many("skeleton", [key])[key])["labels"] == [3]
