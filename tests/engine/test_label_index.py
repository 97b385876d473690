"""The label index against the voxels it describes: every path by which a supercuboid reaches
the base tier keeps it (cache write-back, direct writes, NDBlaze merges, downsampling, a purge;
ingest writes through the direct path), a crash between its writes and the object's leaves it a
marked superset that readers work around and `rebuild` settles, and the data plane's ids and
boundingbox answer from it exactly what a voxel scan answers.

Services built by the wiring on the local default (a directory, SQLite files), real Redis."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ndstore import wiring
from ndstore.core.errors import StorageError
from ndstore.core.geometry import Box
from ndstore.core.keys import SupercuboidKey
from ndstore.core.labels import label_counts
from ndstore.engine.dataplane import Read, Write
from ndstore.engine.label_index import LabelKeeper, rebuild
from ndstore.engine.volume import ChannelVolume, Cutout, make_cutout
from ndstore.storage.locks import LocalLocks
from ndstore.testing.memory import MemoryLabelIndex, MemoryObjectStore

TOP = 2**64 - 1
LIMIT = 1 << 34


def label_channel(cid: int = 1, times: int = 1, dtype: str = "uint64") -> ChannelVolume:
    """Two supercuboids in x, one in y, one and a half in z; three levels."""
    probe = ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), (1, 1, 1)), 3, "anisotropic", times)
    sx, sy, sz = probe.grid(0).supercuboid
    return ChannelVolume(1, 1, cid, np.dtype(dtype), Box((0, 0, 0), (2 * sx, sy, sz + sz // 2)), 3, "anisotropic",
                         times, annotation=True)


@pytest.fixture
def ch(svc: wiring.Services) -> ChannelVolume:
    chan = label_channel()
    assert svc.labels is not None
    svc.labels.register([chan.name_prefix], complete=True)  # as the channel's creation does
    return chan


def cut(ch: ChannelVolume, lo: tuple[int, int, int], hi: tuple[int, int, int], res: int = 0, t: int = 0) -> Cutout:
    return make_cutout(ch, res, Box(lo, hi), range(t, t + 1), LIMIT)


def blob(shape_zyx: tuple[int, int, int], labels: list[int], seed: int, dtype: str = "uint64") -> Any:
    """Random voxels of ``labels`` (0 among them, if given)."""
    rng = np.random.default_rng(seed)
    return np.asarray(labels, dtype)[rng.integers(0, len(labels), shape_zyx)][np.newaxis]


def level_keys(svc: wiring.Services, ch: ChannelVolume, res: int, t: int = 0) -> list[SupercuboidKey]:
    """Every supercuboid either index names at a level."""
    assert svc.labels is not None
    volume = ch.volume_key(res, t)
    named = {volume.supercuboid(m) for m in svc.index.mortons(volume)}
    return sorted(named | {k for k in svc.labels.index.indexed(ch.name_prefix) if k.volume == volume})


def voxel_truth(svc: wiring.Services, ch: ChannelVolume, res: int, t: int = 0) -> dict[SupercuboidKey, dict[int, int]]:
    """label -> voxels of each stored supercuboid of a level, from its object."""
    out = {}
    for key in level_keys(svc, ch, res, t):
        labels, voxels = label_counts(svc.cache_tier._base.read_supercuboid(key, ch.grid(res), ch.dtype))
        if len(labels):
            out[key] = dict(zip(labels.tolist(), voxels.tolist()))
    return out


def indexed(svc: wiring.Services, ch: ChannelVolume, res: int, t: int = 0) -> dict[SupercuboidKey, dict[int, int]]:
    assert svc.labels is not None
    return {k: c for k, c in svc.labels.labels_of(level_keys(svc, ch, res, t)).items() if c}


def assert_index_is_the_voxels(svc: wiring.Services, ch: ChannelVolume, res: int = 0, t: int = 0) -> None:
    assert svc.labels is not None
    assert indexed(svc, ch, res, t) == voxel_truth(svc, ch, res, t)
    assert svc.labels.unsettled(ch.volume_key(res, t)) == set()


def scanned_ids(svc: wiring.Services, cutout: Cutout) -> list[int]:
    data = svc.plane.read(cutout)
    return sorted(set(np.unique(data).tolist()) - {0})


def scanned_box(svc: wiring.Services, ch: ChannelVolume, res: int, label: int) -> dict[str, list[int]] | None:
    """The tight bounding box of a label, from a read of the whole level."""
    extent = ch.extent(res)
    data = svc.plane.read(Cutout(ch, res, extent, range(ch.num_time_samples)))  # (t, z, y, x)
    where = np.argwhere(data == label)
    if not len(where):
        return None
    (t0, z0, y0, x0), (t1, z1, y1, x1) = where.min(axis=0).tolist(), (where.max(axis=0) + 1).tolist()
    ox, oy, oz = extent.lo
    return {"x_range": [x0 + ox, x1 + ox], "y_range": [y0 + oy, y1 + oy], "z_range": [z0 + oz, z1 + oz],
            "t_range": [t0, t1]}


def test_every_path_to_the_base_tier_keeps_the_index(svc: wiring.Services, ch: ChannelVolume) -> None:
    sx, sy, sz = ch.grid(0).supercuboid
    plane = svc.plane
    # a cache write: nothing in the base tier until written back, then indexed
    plane.write(cut(ch, (0, 0, 0), (300, 200, 4)), blob((4, 200, 300), [0, 5, TOP], 1))
    assert indexed(svc, ch, 0) == {}
    svc.cache_tier.upkeep.flush_all()
    assert_index_is_the_voxels(svc, ch)
    assert set(indexed(svc, ch, 0)[ch.volume_key(0, 0).supercuboid(0)]) == {5, TOP}  # never 0
    # a direct write over two supercuboids, partly over the first's labels
    plane.write(cut(ch, (200, 0, 0), (sx + 100, 64, sz)), blob((sz, 64, sx - 100), [6, 7], 2), Write.DIRECT)
    assert_index_is_the_voxels(svc, ch)
    # an NDBlaze write, merged
    plane.write(cut(ch, (sx + 10, 100, 2), (sx + 20, 110, sz + 3)), blob((sz + 1, 10, 10), [8, 2**63], 3),
                Write.BUFFERED)
    merged = svc.merger.merge(svc.blaze_buffer.pending_names())
    assert merged.supercuboids == 2  # split in z
    assert_index_is_the_voxels(svc, ch)
    # zeros over a whole supercuboid: deleted, and its labels with it
    plane.write(cut(ch, (0, 0, 0), (sx, sy, sz)), np.zeros((1, sz, sy, sx), np.uint64), Write.DIRECT)
    assert ch.volume_key(0, 0).supercuboid(0) not in indexed(svc, ch, 0)
    assert_index_is_the_voxels(svc, ch)
    # downsampling: level 1 built by the mode, indexed as it is stored
    for parent in svc.downsampler.manifest(ch, 1):
        svc.downsampler.build_parent(ch, parent)
    assert indexed(svc, ch, 1)
    assert_index_is_the_voxels(svc, ch, 1)
    # a purge: every entry of the channel gone
    plane.purge(ch)
    assert svc.labels is not None and svc.labels.index.indexed(ch.name_prefix) == []


def test_a_crash_between_the_writes_leaves_a_marked_superset_that_reads_work_around(
        svc: wiring.Services, ch: ChannelVolume, monkeypatch: pytest.MonkeyPatch) -> None:
    assert svc.labels is not None
    sx, sy, sz = ch.grid(0).supercuboid
    whole = cut(ch, (0, 0, 0), (sx, sy, sz))
    svc.plane.write(whole, blob((sz, sy, sx), [0, 1, 2], 1), Write.DIRECT)
    put = svc.objects.put_many

    def crash(items: Any) -> None:
        if any("&0&0&0" in k for k in items):
            raise StorageError("the process died here")
        put(items)

    monkeypatch.setattr(svc.objects, "put_many", crash)
    with pytest.raises(StorageError):
        svc.plane.write(whole, blob((sz, sy, sx), [3, TOP], 2), Write.DIRECT)
    monkeypatch.setattr(svc.objects, "put_many", put)
    key = ch.volume_key(0, 0).supercuboid(0)
    assert svc.labels.labels_of([key])[key].keys() == {1, 2, 3, TOP}  # the old labels and the new: a superset
    assert svc.labels.unsettled(ch.volume_key(0, 0)) == {0}
    # reads trust the voxels of a marked supercuboid, not its entries
    assert svc.plane.ids(whole).tolist() == [1, 2]
    assert svc.plane.bounding_box(ch, 0, 3, loose=False) is None
    assert svc.plane.bounding_box(ch, 0, 1, loose=False) == scanned_box(svc, ch, 0, 1)
    # a rebuild settles it
    rebuilt = rebuild(svc.labels, svc.objects, svc.locks, [ch.name_prefix])
    assert rebuilt.supercuboids == 1 and rebuilt.incomplete == []
    assert_index_is_the_voxels(svc, ch)


def test_lost_entries_are_found_again_by_a_rebuild(svc: wiring.Services, ch: ChannelVolume) -> None:
    """Entries lost (an index restored from an older copy): reads miss them until the rebuild."""
    assert svc.labels is not None
    sx, sy, sz = ch.grid(0).supercuboid
    everything = cut(ch, (0, 0, 0), (2 * sx, sy, sz))
    svc.plane.write(everything, blob((sz, sy, 2 * sx), [0, 11, 12, TOP], 4), Write.DIRECT)
    before = indexed(svc, ch, 0)
    svc.labels.index.settle({k: list(c) for k, c in before.items()})
    assert svc.plane.ids(everything).tolist() == []
    rebuild(svc.labels, svc.objects, svc.locks, [ch.name_prefix])
    assert indexed(svc, ch, 0) == before
    assert svc.plane.ids(everything).tolist() == scanned_ids(svc, everything) == [11, 12, TOP]


def test_a_supercuboid_of_too_many_labels_is_read_not_recorded(svc: wiring.Services, ch: ChannelVolume) -> None:
    assert svc.labels is not None
    svc.labels.max_labels = 8
    sx, sy, sz = ch.grid(0).supercuboid
    whole = cut(ch, (0, 0, 0), (sx, sy, sz))
    svc.plane.write(whole, blob((sz, sy, sx), list(range(1, 21)), 5), Write.DIRECT)
    volume = ch.volume_key(0, 0)
    assert svc.labels.index.unsettled(volume) == {0: "dense: more than 8 labels"}
    assert indexed(svc, ch, 0) == {}
    assert svc.plane.ids(whole).tolist() == list(range(1, 21))
    assert svc.plane.bounding_box(ch, 0, 20, loose=False) == scanned_box(svc, ch, 0, 20)
    svc.plane.write(whole, blob((sz, sy, sx), [0, 4], 6), Write.DIRECT)  # few again: recorded, unmarked
    assert_index_is_the_voxels(svc, ch)


@pytest.mark.parametrize("dtype", ["uint64", "uint32"])
def test_ids_and_boundingbox_answer_what_a_voxel_scan_answers(svc: wiring.Services, dtype: str) -> None:
    """Writes through every path, some left dirty in the cache, some pending in NDBlaze, over
    two time samples; every box (whole supercuboids, parts, both) and every label."""
    assert svc.labels is not None
    ch = label_channel(cid=2, times=2, dtype=dtype)
    svc.labels.register([ch.name_prefix], complete=True)
    sx, sy, sz = ch.grid(0).supercuboid
    top = int(np.iinfo(dtype).max)
    rng = np.random.default_rng(9)
    paths = [Write.DIRECT, Write.CACHE, Write.BUFFERED]
    for i in range(9):
        lo = (int(rng.integers(0, 2 * sx - 50)), int(rng.integers(0, sy - 50)), int(rng.integers(0, sz)))
        hi = (min(2 * sx, lo[0] + int(rng.integers(20, sx))), min(sy, lo[1] + int(rng.integers(20, sy))),
              min(sz + sz // 2, lo[2] + int(rng.integers(1, sz))))
        shape = (hi[2] - lo[2], hi[1] - lo[1], hi[0] - lo[0])
        labels = [0, *rng.integers(1, 1000, 3).tolist(), top]
        svc.plane.write(cut(ch, lo, hi, t=i % 2), blob(shape, labels, i, dtype), paths[i % 3])
        if i == 5:
            svc.cache_tier.upkeep.flush_all()
            svc.merger.merge(svc.blaze_buffer.pending_names())
    for t in (0, 1):
        for lo, hi in (((0, 0, 0), (2 * sx, sy, sz + sz // 2)), ((0, 0, 0), (sx, sy, sz)),
                       ((sx, 0, 0), (2 * sx, sy, sz)), ((100, 10, 1), (sx + 7, sy - 3, sz + 2))):
            box = cut(ch, lo, hi, t=t)
            assert svc.plane.ids(box).tolist() == scanned_ids(svc, box), (t, lo, hi)
            assert svc.plane.ids(box).dtype == np.dtype(dtype)
    every = Cutout(ch, 0, ch.extent(0), range(2))
    for label in [*scanned_ids(svc, every), 999_999]:
        assert svc.plane.bounding_box(ch, 0, label, loose=False) == scanned_box(svc, ch, 0, label), label
    assert svc.plane.bounding_box(ch, 0, top + 1, loose=False) is None  # beyond the dtype: nowhere


def test_boundingbox_reads_only_the_supercuboids_that_hold_the_label(svc: wiring.Services, ch: ChannelVolume,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sx, sy, sz = ch.grid(0).supercuboid
    svc.plane.write(cut(ch, (0, 0, 0), (2 * sx, sy, sz + sz // 2)), blob((sz + sz // 2, sy, 2 * sx), [1, 2], 7),
                    Write.DIRECT)
    svc.plane.write(cut(ch, (sx + 5, 6, 1), (sx + 9, 9, 2)), np.full((1, 1, 3, 4), 77, np.uint64), Write.DIRECT)
    read = svc.plane.read
    boxes: list[Box] = []

    def counted(cutout: Cutout, mode: Read = Read.LIVE) -> Any:
        boxes.append(cutout.box)
        return read(cutout, mode)

    monkeypatch.setattr(svc.plane, "read", counted)
    found = svc.plane.bounding_box(ch, 0, 77, loose=False)
    assert found == {"x_range": [sx + 5, sx + 9], "y_range": [6, 9], "z_range": [1, 2], "t_range": [0, 1]}
    assert boxes == [Box((sx, 0, 0), (2 * sx, sy, sz))]  # one of the four stored supercuboids


def test_an_unregistered_channel_is_not_indexed_and_scanned(svc: wiring.Services) -> None:
    assert svc.labels is not None
    ch = label_channel(cid=3)
    box = cut(ch, (0, 0, 0), (64, 64, 4))
    svc.plane.write(box, blob((4, 64, 64), [0, 9], 8), Write.DIRECT)
    assert svc.labels.index.indexed(ch.name_prefix) == []
    assert svc.plane.ids(box).tolist() == [9]
    assert svc.plane.bounding_box(ch, 0, 9, loose=False) == scanned_box(svc, ch, 0, 9)


def test_a_channel_registered_later_is_indexed_once_every_process_knows() -> None:
    """A process remembers "not registered" for unknown_ttl_s; a rebuild waits that long after
    registering a channel before it counts."""
    now = [0.0]
    index = MemoryLabelIndex()
    keeper = LabelKeeper(index, unknown_ttl_s=30, clock=lambda: now[0])
    volume = label_channel(cid=4).volume_key(0, 0)
    assert not keeper.keeps(volume)
    index.register([volume.channel_prefix], complete=False)  # by another process
    now[0] = 29.0
    assert not keeper.keeps(volume)
    now[0] = 30.0
    assert keeper.keeps(volume)
    index.register([], complete=False)
    assert keeper.keeps(volume)  # for good

    slept: list[float] = []
    fresh = LabelKeeper(MemoryLabelIndex(), unknown_ttl_s=30)
    rebuild(fresh, MemoryObjectStore(), LocalLocks(), [volume.channel_prefix], sleep=slept.append)
    assert slept == [30] and fresh.serves(volume.channel_prefix)
    rebuild(fresh, MemoryObjectStore(), LocalLocks(), [volume.channel_prefix], sleep=slept.append)
    assert slept == [30]  # complete already: no wait
