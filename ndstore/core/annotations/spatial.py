"""The multi-level spatial index of a layer's annotations, computed at once from their bounding
boxes with numpy (docs/design/annotations.md).

Levels go from one cell over the whole frame (level 0) to finer grids: each halves the cells
along the dimensions that keep them closest to cubes in physical units. Every annotation is
emitted at exactly one level, chosen deterministically: annotations are ranked by a hash of their
id (their priority, a pseudo-random order fixed by the id); in each cell of a level the first
`limit` by priority whose centre lies in the cell are emitted there, the rest go down a level. An
annotation too big for the next level (its box would span more than two of its cells along some
axis) is emitted where it is, so an annotation is written into at most 8 cells of its level, all
those its box meets. The last level takes whatever remains; a level's `limit` in the info is the
most any of its cells holds (at least the asked limit). A cell lists its annotations in priority
order: any prefix is a uniform sample, as Neuroglancer expects.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

MAX_LEVELS = 12
Vec = tuple[float, float, float]


@dataclass(frozen=True)
class Level:
    grid_shape: tuple[int, int, int]
    chunk_size: Vec
    limit: int
    keys: np.ndarray  # int64 cell keys (x + gx * (y + gy * z)) that hold annotations, ascending
    starts: np.ndarray  # int64, len(keys) + 1: where each cell's members begin
    members: np.ndarray  # int64 indices of the annotations, cell by cell, each in priority order

    def cell(self, x: int, y: int, z: int) -> np.ndarray:
        """The indices of the annotations of one cell (empty where it holds none)."""
        gx, gy, _ = self.grid_shape
        key = x + gx * (y + gy * z)
        i = int(np.searchsorted(self.keys, key))
        if i == len(self.keys) or self.keys[i] != key:
            return self.members[:0]
        return self.members[self.starts[i]:self.starts[i + 1]]

    def contains(self, cell: tuple[int, int, int]) -> bool:
        return all(0 <= c < g for c, g in zip(cell, self.grid_shape))


def priority(ids: np.ndarray) -> np.ndarray:
    """splitmix64 of each uint64 id: a fixed pseudo-random order of annotations."""
    z = np.asarray(ids, np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def level_shapes(lower: Vec, upper: Vec, voxel: Vec, max_levels: int = MAX_LEVELS) -> list[tuple[tuple[int, ...], Vec]]:
    """(grid_shape, chunk_size) of each possible level, coarse to fine: each halves the dimensions
    whose physical size is within a factor sqrt(2) of the largest (chunks not below one voxel)."""
    chunk = np.array(upper, float) - np.array(lower, float)
    grid = np.ones(3, np.int64)
    shapes = [(tuple(int(g) for g in grid), tuple(float(c) for c in chunk))]
    while len(shapes) < max_levels:
        physical = chunk * np.array(voxel, float)
        halve = (physical * np.sqrt(2) >= physical.max()) & (chunk >= 2)
        if not halve.any():
            break
        chunk = np.where(halve, chunk / 2, chunk)
        grid = np.where(halve, grid * 2, grid)
        shapes.append((tuple(int(g) for g in grid), tuple(float(c) for c in chunk)))
    return shapes  # type: ignore[return-value]


def _cells(points: np.ndarray, lower: np.ndarray, chunk: np.ndarray, grid: np.ndarray) -> np.ndarray:
    return np.clip(np.floor((points - lower) / chunk), 0, grid - 1).astype(np.int64)  # type: ignore[no-any-return]


def build(ids: np.ndarray, lo: np.ndarray, hi: np.ndarray, lower: Vec, upper: Vec, voxel: Vec, limit: int,
          max_levels: int = MAX_LEVELS) -> list[Level]:
    """The levels of n annotations with uint64 ``ids`` and (n, 3) bounding boxes ``lo``..``hi``."""
    shapes = level_shapes(lower, upper, voxel, max_levels)
    if not len(ids):
        empty = np.zeros(0, np.int64)
        return [Level(shapes[0][0], shapes[0][1], limit, empty, np.zeros(1, np.int64), empty)]  # type: ignore[arg-type]
    origin = np.array(lower, float)
    order = np.argsort(priority(ids), kind="stable")
    rank = np.empty(len(ids), np.int64)
    rank[order] = np.arange(len(ids))
    remaining = order
    levels: list[Level] = []
    for number, (grid_shape, chunk_size) in enumerate(shapes):
        grid, chunk = np.array(grid_shape), np.array(chunk_size)
        last = number == len(shapes) - 1
        take = np.ones(len(remaining), bool) if last else _taken(remaining, lo, hi, origin, grid, chunk,
                                                                  shapes[number + 1], limit)
        emitted, remaining = remaining[take], remaining[~take]
        levels.append(_level(emitted, lo, hi, origin, grid, chunk, rank, limit))
        if not len(remaining):
            break
    return levels


def _taken(remaining: np.ndarray, lo: np.ndarray, hi: np.ndarray, origin: np.ndarray, grid: np.ndarray,
           chunk: np.ndarray, finer: tuple[tuple[int, ...], Vec], limit: int) -> np.ndarray:
    """Which of the remaining annotations (in priority order) a level emits: the first `limit` of
    each cell by their centres, and those too big for the finer level."""
    home = _cells((lo[remaining] + hi[remaining]) / 2, origin, chunk, grid)
    keys = home[:, 0] + grid[0] * (home[:, 1] + grid[1] * home[:, 2])
    by_cell = np.argsort(keys, kind="stable")  # priority order kept within a cell
    sorted_keys = keys[by_cell]
    first = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(len(keys)), 0))
    within = np.empty(len(keys), np.int64)
    within[by_cell] = np.arange(len(keys)) - start
    fine_grid, fine_chunk = np.array(finer[0]), np.array(finer[1])
    span = (_cells(hi[remaining], origin, fine_chunk, fine_grid)
            - _cells(lo[remaining], origin, fine_chunk, fine_grid) + 1)
    return (within < limit) | (span > 2).any(axis=1)  # type: ignore[no-any-return]


def _level(emitted: np.ndarray, lo: np.ndarray, hi: np.ndarray, origin: np.ndarray, grid: np.ndarray,
           chunk: np.ndarray, rank: np.ndarray, limit: int) -> Level:
    """A level holding ``emitted``, each in every cell its box meets (at most two per axis)."""
    first, last = _cells(lo[emitted], origin, chunk, grid), _cells(hi[emitted], origin, chunk, grid)
    keys, members = [], []
    for step in itertools.product((0, 1), repeat=3):
        cell = first + np.array(step)
        inside = (cell <= last).all(axis=1)
        keys.append((cell[inside, 0] + grid[0] * (cell[inside, 1] + grid[1] * cell[inside, 2])).astype(np.int64))
        members.append(emitted[inside])
    all_keys, all_members = np.concatenate(keys), np.concatenate(members).astype(np.int64)
    order = np.lexsort((rank[all_members], all_keys))
    all_keys, all_members = all_keys[order], all_members[order]
    cells, starts = np.unique(all_keys, return_index=True)
    starts = np.r_[starts, len(all_keys)].astype(np.int64)
    most = int(np.diff(starts).max(initial=0))
    return Level(tuple(int(g) for g in grid), tuple(float(c) for c in chunk),  # type: ignore[arg-type]
                 max(limit, most), cells.astype(np.int64), starts, all_members)
