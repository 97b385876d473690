"""The record of built levels (ndstore/engine/levels.py) in the object store: what each process
that writes voxels marks, every other process sees, and no two marks undo each other."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ndstore.core.geometry import Box
from ndstore.engine.index_check import stored_supercuboids
from ndstore.engine.levels import StoredLevels
from ndstore.engine.volume import ChannelVolume
from ndstore.storage.filestore import FileObjectStore

CHANNEL = ChannelVolume(1, 2, 3, np.dtype("uint8"), Box((0, 0, 0), (4096, 4096, 64)), 6, "anisotropic", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_marks_reach_another_process_and_are_kept(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path)
    objects.ensure_ready()
    clock = Clock()
    here, there = StoredLevels(objects, 1.0, clock), StoredLevels(objects, 1.0, clock)
    assert there.built(CHANNEL) == [0]
    here.note_written(CHANNEL, 3)
    assert here.built(CHANNEL) == [0, 3]  # at once where it was written
    assert there.built(CHANNEL) == [0]  # another process asks again only after recheck_s
    clock.now = 1.5
    assert there.built(CHANNEL) == [0, 3]
    here.note_all_built(CHANNEL)
    clock.now = 3.0
    assert there.built(CHANNEL) == list(range(6))
    assert list(stored_supercuboids(objects)) == []  # a mark is not a supercuboid to reindex or purge


def test_concurrent_marks_of_different_levels_all_stand(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path)
    objects.ensure_ready()
    workers = [StoredLevels(objects) for _ in range(5)]
    threads = [threading.Thread(target=w.note_written, args=(CHANNEL, level + 1)) for level, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert StoredLevels(objects).built(CHANNEL) == list(range(6))


def test_a_deleted_channel_forgets_its_levels_and_others_keep_theirs(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path)
    objects.ensure_ready()
    other = ChannelVolume(1, 2, 4, np.dtype("uint8"), CHANNEL.frame, 6, "anisotropic", 1)
    levels = StoredLevels(objects)
    levels.note_all_built(CHANNEL)
    levels.note_written(other, 2)
    levels.forget(CHANNEL)
    fresh = StoredLevels(objects)
    assert fresh.built(CHANNEL) == [0] and fresh.built(other) == [0, 2]
    assert levels.built(CHANNEL) == [0]
