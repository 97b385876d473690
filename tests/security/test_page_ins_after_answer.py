"""An attacker's view of page-ins that finish after their read answered (`PageIns`,
ndstore/engine/cache/copies.py): a flood of cold reads, each of another supercuboid, must not let
a worker pile up fetched objects behind its answers. Beyond the room (one read window per
process) a read stores its page-in before it answers, so what it holds ends with its request,
inside the request budget. Real redis-server and file store; a gate holds the real page-ins
back so the flood is all in flight."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis

from ndstore.core.geometry import Box
from ndstore.engine.volume import make_cutout
from tests.engine.conftest import make_cache_tier, small_channel
from tests.engine.test_page_ins_after_answer import WAIT_S, Gate

CHANNEL = small_channel("uint8", cid=37)
GRID = CHANNEL.grid(0)
EXTENT = CHANNEL.extent(0)
SC = GRID.supercuboid


def cut(box: Box) -> Any:
    return make_cutout(CHANNEL, 0, box, range(1), 1 << 32)


def supercuboid_boxes() -> list[Box]:
    counts = [-(-EXTENT.hi[i] // SC[i]) for i in range(3)]
    return [Box((x * SC[0], y * SC[1], z * SC[2]),
                tuple(min((v + 1) * SC[i], EXTENT.hi[i]) for i, v in enumerate((x, y, z))))  # type: ignore[arg-type]
            for x, y, z in itertools.product(*(range(c) for c in counts))]


def test_a_flood_of_cold_reads_holds_no_more_than_the_room_after_answers(tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    tier = make_cache_tier(tmp_path, redis_url)
    room_for = 2
    tier._page_ins._room = room_for * GRID.supercuboid_bytes(1)
    boxes = supercuboid_boxes()
    assert len(boxes) > 2 * room_for
    volume = np.random.default_rng(37).integers(1, 255, EXTENT.shape_zyx, dtype=np.uint8)
    tier.write_base(cut(EXTENT), volume[np.newaxis])
    gate = Gate(tier)
    answers: dict[int, np.ndarray] = {}
    readers = [threading.Thread(target=lambda i=i, b=b: answers.__setitem__(i, tier.read(cut(b))), daemon=True)
               for i, b in enumerate(boxes)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + WAIT_S
    while len(answers) < room_for and time.monotonic() < deadline:  # those with room answer at once
        time.sleep(0.05)
    time.sleep(0.5)  # and no other does while the page-ins are held back
    # only those with room answered; the rest wait for their own page-ins; nothing beyond the room is held
    assert len(answers) == room_for, f"{len(answers)} reads answered with their page-ins held back"
    assert tier._page_ins._held <= tier._page_ins._room
    gate.open()
    for reader in readers:
        reader.join(WAIT_S)
        assert not reader.is_alive()
    tier.settle()
    assert tier._page_ins._held == 0
    for i, box in enumerate(boxes):
        np.testing.assert_array_equal(answers[i][0], volume[box.slices_zyx()])
    assert all(tier._cache.resident(cut(b).plan().names) == [True] for b in boxes)


def test_a_flood_of_cold_small_writes_holds_no_more_than_the_room_after_answers(tmp_path: Path,
                                                                               redis_url: str) -> None:
    """Each small write into another supercuboid not resident fetches its object; beyond the room
    a write does not keep it (the rest stays absent), so every write answers and the worker holds
    no more than the room while the stores after the answers are held back."""
    redis.Redis.from_url(redis_url).flushdb()
    tier = make_cache_tier(tmp_path, redis_url)
    room_for = 2
    tier._page_ins._room = room_for * GRID.supercuboid_bytes(1)
    volume = np.random.default_rng(38).integers(1, 255, EXTENT.shape_zyx, dtype=np.uint8)
    tier.write_base(cut(EXTENT), volume[np.newaxis])
    gate = Gate(tier, "fill")
    strokes = [Box((b.lo[0] + 3, b.lo[1] + 5, b.lo[2] + 1), (b.lo[0] + 20, b.lo[1] + 30, b.lo[2] + 3))
               for b in supercuboid_boxes()]
    assert len(strokes) > 2 * room_for
    writers = [threading.Thread(target=tier.write, args=(cut(s), np.full((1, *s.shape_zyx), 9, np.uint8)),
                                daemon=True) for s in strokes]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(WAIT_S)
        assert not writer.is_alive(), "a write waited for the rest of its object to be stored"
    assert gate.entered.wait(WAIT_S)
    assert 0 < tier._page_ins._held <= tier._page_ins._room
    gate.open()
    tier.settle()
    assert tier._page_ins._held == 0
    for s in strokes:
        volume[s.slices_zyx()] = 9
    np.testing.assert_array_equal(tier.read(cut(EXTENT))[0], volume)
