"""The annotation encoder (ndstore.core.annotations.layout) against a decoder written from
Neuroglancer's spec (tests/annotation_decoder.py), for arbitrary layouts and values; and the
spatial index's promises: every annotation at exactly one level, cells within their limit, the
same index from the same ids whatever their order, large annotations kept coarse."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ndstore.core.annotations import layout as lay
from ndstore.core.annotations import spatial
from tests.annotation_decoder import multiple, single

TYPES = list(lay.GEOMETRY_FLOATS)
PROPERTY_TYPES = list(lay.PROPERTY_TYPES)
NG_TYPE = lay.NEUROGLANCER_TYPE


def values_of(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    code, count, _ = lay.PROPERTY_TYPES[kind]
    dtype = np.dtype(code)
    if dtype.kind == "f":
        return rng.normal(0, 1000, n).astype(np.float32)
    info = np.iinfo(dtype)
    shape = (n, count) if count > 1 else (n,)
    return rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dtype)


@given(st.sampled_from(TYPES), st.lists(st.sampled_from(PROPERTY_TYPES), max_size=8), st.integers(0, 2**32 - 1),
       st.integers(0, 3), st.integers(0, 20))
def test_records_decode_as_the_spec_says(kind: str, props: list[str], seed: int, relationships: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    layout = lay.Layout(kind, tuple((f"p{i}", t) for i, t in enumerate(props)))
    info: dict[str, Any] = {"annotation_type": NG_TYPE[kind], "relationships": [f"r{i}" for i in range(relationships)],
                            "properties": [{"id": pid, "type": t} for pid, t in layout.properties]}
    geometry = rng.normal(0, 1e4, (n, layout.floats)).astype(np.float32)
    values = {pid: values_of(t, n, rng) for pid, t in layout.properties}
    records = lay.records(layout, geometry, values)
    assert records.shape == (n, layout.size) and layout.size % 4 == 0
    ids = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    decoded = multiple(lay.annotation_list(records, ids), info)
    assert [a.id for a in decoded] == ids.tolist()
    for i, a in enumerate(decoded):
        assert a.geometry == tuple(geometry[i].tolist())
        for pid, _ in layout.properties:
            expected = values[pid][i].tolist()
            assert a.properties[pid] == expected or (np.isnan(expected) and np.isnan(a.properties[pid]))
        related = [sorted(rng.integers(1, 2**64 - 1, rng.integers(0, 4), dtype=np.uint64).tolist())
                   for _ in range(relationships)]
        one = single(lay.with_relationships(records[i].tobytes(), related), info)
        assert one.geometry == a.geometry and one.related == related


def test_the_property_order_follows_the_spec() -> None:
    layout = lay.Layout("point", (("a", "uint8"), ("b", "float32"), ("c", "rgb"), ("d", "int16"), ("e", "uint32")))
    assert layout.offsets == {"b": 12, "e": 16, "d": 20, "a": 22, "c": 23}
    assert layout.size == 28  # 26 bytes, padded to a multiple of 4


def boxes(n: int, seed: int, size: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(1, 10 * n + 2, dtype=np.uint64), n, replace=False)
    lo = rng.uniform(0, [1000 - size, 800 - size, 100 - size / 10], (n, 3))
    return ids, lo, lo + [size, size, size / 10]


def placements(levels: list[spatial.Level]) -> dict[int, list[tuple[int, int]]]:
    """annotation index -> [(level, cell key), ...]."""
    out: dict[int, list[tuple[int, int]]] = {}
    for number, level in enumerate(levels):
        for key, start, stop in zip(level.keys, level.starts[:-1], level.starts[1:]):
            for member in level.members[start:stop]:
                out.setdefault(int(member), []).append((number, int(key)))
    return out


@given(st.integers(0, 3000), st.integers(0, 2**32 - 1), st.sampled_from([10, 100]))
def test_every_point_is_at_one_level_in_one_cell(n: int, seed: int, limit: int) -> None:
    ids, lo, hi = boxes(n, seed)
    levels = spatial.build(ids, lo, hi, (0, 0, 0), (1000, 800, 100), (4, 4, 40), limit)
    where = placements(levels)
    assert sorted(where) == list(range(n)) and all(len(p) == 1 for p in where.values())
    for level in levels[:-1]:
        assert level.limit == limit and (np.diff(level.starts) <= limit).all()
    last = levels[-1]
    assert (np.diff(last.starts) <= last.limit).all()
    for level in levels:  # within a cell: priority order
        for start, stop in zip(level.starts[:-1], level.starts[1:]):
            assert (np.diff(spatial.priority(ids[level.members[start:stop]]).astype(np.float64)) >= 0).all()


def test_the_index_depends_on_the_ids_not_their_order() -> None:
    ids, lo, hi = boxes(2000, 7)
    order = np.random.default_rng(1).permutation(len(ids))
    a = spatial.build(ids, lo, hi, (0, 0, 0), (1000, 800, 100), (4, 4, 40), 50)
    b = spatial.build(ids[order], lo[order], hi[order], (0, 0, 0), (1000, 800, 100), (4, 4, 40), 50)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.keys == y.keys).all() and (ids[x.members] == ids[order][y.members]).all()


def test_large_annotations_stay_coarse_and_meet_at_most_8_cells() -> None:
    ids, lo, hi = boxes(500, 3, size=300.0)
    levels = spatial.build(ids, lo, hi, (0, 0, 0), (1000, 800, 100), (4, 4, 40), 1)
    where = placements(levels)
    assert sorted(where) == list(range(500))
    assert all(len({lv for lv, _ in p}) == 1 and len(p) <= 8 for p in where.values())
    assert max(lv for p in where.values() for lv, _ in p) <= 2  # 300 voxels: no finer than 250-voxel cells


def test_level_shapes_approach_cubes_in_nm() -> None:
    shapes = spatial.level_shapes((0, 0, 0), (1024, 1024, 64), (4, 4, 40))
    assert shapes[0] == ((1, 1, 1), (1024.0, 1024.0, 64.0))
    # 4096 x 4096 x 2560 nm: x and y halve first, then all three together
    assert [s[0] for s in shapes[1:4]] == [(2, 2, 1), (4, 4, 2), (8, 8, 4)]
    for grid, chunk in shapes:
        assert tuple(g * c for g, c in zip(grid, chunk)) == (1024.0, 1024.0, 64.0)
