"""Small reads and writes without locks, where the cache offers lock-free commits (its own
capability, `CuboidCache.lock_free`: the Redis cache built with the locks that share its Redis).

A read of at most SNAPSHOT_CUBOIDS cuboids is one atomic snapshot when every supercuboid is
resident, none is lost and no writer holds one. A write of at most LOCK_FREE_WRITE_CUBOIDS, of
which at most LOCK_FREE_MERGE_CUBOIDS partly covered, whose new blobs come to at most
LOCK_FREE_WRITE_BYTES, compresses its whole cuboids, reads the partly covered ones with their
digests, merges, and commits only if no one holds a lock on them and those cuboids still have
the digests it read (optimistic: two round trips instead of five). Otherwise, and for every
larger request, the tier's locked read and write (a write that tried first hands on the whole
cuboids it compressed: none is compressed twice). See docs/design/cache-tier.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy.typing as npt

from ndstore.core.errors import DamagedInCache
from ndstore.core.geometry import CUBOID_BYTES
from ndstore.core.observe import NULL, Observer
from ndstore.core.parallel import map_ordered
from ndstore.core.plan import Plan
from ndstore.engine.cache import parts
from ndstore.engine.cache.parts import META, merged, meta, nbytes, touching
from ndstore.engine.volume import Cutout
from ndstore.storage.interfaces import LockFreeCommits

Array = npt.NDArray[Any]
# Reads of at most a supercuboid's worth of cuboids (16 MiB) go without locks: faster and cheaper
# in CPU at every size up to it (docs/design/serving.md, "Which requests go without locks"). Up to
# SERIAL_DECODE_CUBOIDS they are decoded in the request's thread: a hop to the codec pool and back
# costs more than a few decodes.
SNAPSHOT_CUBOIDS = 64
SERIAL_DECODE_CUBOIDS = 16
# A lock-free write first reads the cuboids it covers partly: at most these many (4 MiB of uint8).
LOCK_FREE_MERGE_CUBOIDS = 16
# Writes go without locks up to a supercuboid's worth of cuboids when their new blobs fit what 16
# incompressible cuboids take (so a supercuboid of labels does, and one of EM voxels does not): a
# commit is one transaction, which Redis buffers whole for its AOF, and one of 16 MiB took 1.4-1.8x
# as long as the locked path's commands of 2 MiB (serving.md, "Which requests go without locks").
LOCK_FREE_WRITE_CUBOIDS = 64
LOCK_FREE_WRITE_BYTES = 16 * (CUBOID_BYTES + 1024)  # room for blosc's header on each


class LockFreePath:
    def __init__(self, commits: LockFreeCommits, pool: ThreadPoolExecutor, codec: ThreadPoolExecutor,
                 clock: Callable[[], float] = time.time, observer: Observer = NULL):
        """``pool``: compresses a write's supercuboids side by side; ``codec``: per-cuboid work."""
        self.commits = commits
        self._pool = pool
        self._codec = codec
        self._clock = clock
        self._observer = observer

    def read(self, cutout: Cutout, plan: Plan, out: Array) -> bool:
        """The lock-free snapshot of a small read into ``out``; False when it does not apply
        (too many cuboids) or the cache declined it (then nothing was written)."""
        if len(plan.parts) > SNAPSHOT_CUBOIDS:
            return False
        wanted = {p.key.name: [n for n, _, _ in touching(p.part, plan.grid)] for p in plan.parts}
        count = sum(len(numbers) for numbers in wanted.values())
        if count > SNAPSHOT_CUBOIDS:
            return False
        try:
            blobs = self.commits.read_unlocked(wanted, self._clock())
        except DamagedInCache:
            return False  # the locked read finds it again and repairs it
        if blobs is None or any(b is None for found in blobs.values() for b in found):
            return False
        self._observer.count("cache_reads_total", len(wanted), outcome="hit")
        codec = None if count <= SERIAL_DECODE_CUBOIDS else self._codec
        for p in plan.parts:
            parts.decode(p, blobs[p.key.name], wanted[p.key.name], plan.grid, out, cutout, codec)
        return True

    def stored(self, cutout: Cutout, plan: Plan) -> bytes | None:
        """The stored blob (b"": all zeros) of the one cuboid that holds the whole of ``cutout``,
        from a lock-free snapshot; None when the box spans more than one cuboid or the cache
        declined (not resident, lost, locked, damaged): the caller reads it the usual way."""
        if len(plan.parts) != 1:
            return None
        part = plan.parts[0]
        touched = touching(part.part, plan.grid)
        if len(touched) != 1:
            return None
        number = touched[0][0]
        try:
            blobs = self.commits.read_unlocked({part.key.name: [number]}, self._clock())
        except DamagedInCache:
            return None
        blob = None if blobs is None else blobs[part.key.name][0]
        if blob is None:
            return None
        self._observer.count("cache_reads_total", 1, outcome="hit")
        return bytes(blob)

    def write(self, cutout: Cutout, data: Array) -> dict[str, dict[int, bytes]] | None:
        """The optimistic small write: None once committed. Otherwise (it does not apply, its
        blobs are too many bytes for one transaction, or something it read changed before it
        could commit: then it stored nothing) the blobs of the whole cuboids it compressed, by
        supercuboid, for the locked write to store."""
        plan = cutout.plan()
        if cutout.channel.write_through or len(plan.parts) > LOCK_FREE_WRITE_CUBOIDS:
            return {}
        grid = plan.grid
        touched = {p.key.name: touching(p.part, grid) for p in plan.parts}
        partly = {name: [n for n, cbox, sub in items if sub != cbox] for name, items in touched.items()}
        if sum(len(items) for items in touched.values()) > LOCK_FREE_WRITE_CUBOIDS or \
                sum(len(numbers) for numbers in partly.values()) > LOCK_FREE_MERGE_CUBOIDS:
            return {}
        pieces = {p.key.name: (p, data[p.time_index][p.part.in_box(cutout.box)]) for p in plan.parts}

        def whole_of(name: str) -> dict[int, bytes]:  # its whole cuboids compressed, as the locked write would
            p, src = pieces[name]
            return merged(p, grid, src, [t for t in touched[name] if t[2] == t[1]], {}, self._codec)

        whole = dict(zip(pieces, map_ordered(self._pool, whole_of, list(pieces))))
        if nbytes(whole) > LOCK_FREE_WRITE_BYTES:
            return whole
        try:
            seen = self.commits.read_for_update(partly, self._clock())
        except DamagedInCache:
            return whole  # the locked write finds it again and repairs it
        if seen is None or any(v is None for blobs, digests in seen.values() for v in blobs + digests):
            return whole  # not resident, lost, locked, or a blob stored before digests were
        new = {name: {META: meta(data.dtype, grid), **whole[name],
                      **merged(p, grid, src, [t for t in touched[name] if t[2] != t[1]],
                               dict(zip(partly[name], seen[name][0])), self._codec)}
               for name, (p, src) in pieces.items()}
        if nbytes(new) > LOCK_FREE_WRITE_BYTES:
            return whole
        expected = {name: dict(zip(partly[name], seen[name][1])) for name in partly}
        return None if self.commits.commit_unlocked(new, expected, self._clock()) else whole
