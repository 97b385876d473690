"""Writers in separate processes, each read-modify-writing its own patch of the same
supercuboids through the Redis lease lock: no writer's voxels are lost."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import redis

from ndstore.core.geometry import Box
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.volume import ChannelVolume, make_cutout
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.rwlock import RedisRWLocks
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex

CHANNEL = ChannelVolume(1, 1, 1, np.dtype("uint16"), Box((0, 0, 0), (1024, 512, 32)), 1, "anisotropic", 1)
ROUNDS = 12


def tier(root: str, redis_url: str) -> BaseTier:
    objects, index = FileObjectStore(Path(root) / "o", fsync=False), SqliteSupercuboidIndex(Path(root) / "i.db")
    objects.ensure_ready()
    index.ensure_ready()
    return BaseTier(objects, index, RedisRWLocks(redis.Redis.from_url(redis_url)))


def patch(writer: int) -> Box:
    # Each patch straddles the boundary of two supercuboids in x (at 512).
    y = 20 * writer
    return Box((500, y, 3), (530, y + 15, 6))


def writer(root: str, redis_url: str, n: int) -> None:
    t = tier(root, redis_url)
    box = patch(n)
    for r in range(1, ROUNDS + 1):
        cut = make_cutout(CHANNEL, 0, box, range(1), 1 << 30)
        t.write(cut, np.full(cut.shape, n * 100 + r, np.uint16))


def test_no_lost_updates_between_processes(tmp_path: Path, redis_url: str) -> None:
    tier(str(tmp_path), redis_url)  # create the stores once
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=writer, args=(str(tmp_path), redis_url, n)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    t = tier(str(tmp_path), redis_url)
    whole = t.read(make_cutout(CHANNEL, 0, Box((0, 0, 0), (1024, 512, 32)), range(1), 1 << 30))[0]
    expected = np.zeros_like(whole)
    for n in range(4):
        expected[patch(n).slices_zyx()] = n * 100 + ROUNDS
    np.testing.assert_array_equal(whole, expected)
