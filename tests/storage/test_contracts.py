"""Contract tests written once and run against every backend: the local directory and SQLite
defaults, and S3/DynamoDB over real HTTP (moto's server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.storage.dynamodb import DynamoSupercuboidIndex
from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.interfaces import ObjectStore, SupercuboidIndex
from ndstore.storage.s3 import S3ObjectStore
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "file":
        s: ObjectStore = FileObjectStore(tmp_path / "objects")
    else:
        s = S3ObjectStore(f"b-{uuid.uuid4().hex[:12]}", request.getfixturevalue("moto_endpoint"))
    s.ensure_ready()
    s.ensure_ready()  # idempotent
    yield s


@pytest.fixture(params=["sqlite", "dynamodb"])
def index(request: pytest.FixtureRequest, tmp_path: Path) -> SupercuboidIndex:
    if request.param == "sqlite":
        i: SupercuboidIndex = SqliteSupercuboidIndex(tmp_path / "index.sqlite3")
    else:
        i = DynamoSupercuboidIndex(f"t-{uuid.uuid4().hex[:12]}", request.getfixturevalue("moto_endpoint"))
    i.ensure_ready()
    i.ensure_ready()
    return i


def test_put_get_overwrite_delete(store: ObjectStore) -> None:
    items = {f"k{i}&x": bytes([i]) * (1000 * i + 1) for i in range(20)}
    store.put_many(items)
    assert dict(store.get_many(list(items))) == items
    store.put_many({"k3&x": b"new"})
    assert dict(store.get_many(["k3&x"])) == {"k3&x": b"new"}
    store.delete_many(["k3&x", "k4&x", "never-stored"])
    got = dict(store.get_many(["k3&x", "k4&x", "k5&x"]))
    assert got == {"k3&x": None, "k4&x": None, "k5&x": items["k5&x"]}


def test_missing_keys_read_as_none(store: ObjectStore) -> None:
    assert dict(store.get_many(["nothing-here"])) == {"nothing-here": None}


def test_large_object_round_trip(store: ObjectStore) -> None:
    blob = bytes(range(256)) * (17 * 4096 + 3)
    store.put_many({"big": blob})
    assert dict(store.get_many(["big"]))["big"] == blob


def test_file_store_refuses_unsafe_keys(tmp_path: Path) -> None:
    s = FileObjectStore(tmp_path)
    for bad in ["../escape", "/abs", ""]:
        with pytest.raises(ValueError, match="not a safe relative path"):
            s.put_many({bad: b"x"})


def test_index_tracks_puts_and_deletes_per_volume(index: SupercuboidIndex) -> None:
    a, b = VolumeKey(1, 2, 3, 0, 0), VolumeKey(1, 2, 3, 1, 0)
    mortons = [0, 7, 2**62 + 5, 64, 9]
    index.put_many([a.supercuboid(m) for m in mortons] + [b.supercuboid(1)])
    index.put_many([a.supercuboid(7)])  # idempotent
    assert index.mortons(a) == sorted(mortons)
    assert index.mortons(b) == [1]
    index.delete_many([a.supercuboid(7), a.supercuboid(12345)])
    assert index.mortons(a) == sorted(set(mortons) - {7})
    assert index.mortons(VolumeKey(9, 9, 9, 9, 9)) == []


def test_index_pages_through_many_items(index: SupercuboidIndex) -> None:
    v = VolumeKey(5, 5, 5, 0, 3)
    keys = [SupercuboidKey(v, m) for m in range(0, 3000, 3)]
    index.put_many(keys)
    assert index.mortons(v) == [k.morton for k in keys]


def test_index_lists_a_channels_volumes_by_prefix(index: SupercuboidIndex) -> None:
    """Every level and time sample of channel 1&2&3 (not channel 1&2&31, whose ids only start
    alike), however many the experiment declares: what a channel delete purges."""
    ours = [VolumeKey(1, 2, 3, res, t) for res, t in [(0, 0), (0, 3), (4, 0), (12, 7)]]
    others = [VolumeKey(1, 2, 31, 0, 0), VolumeKey(1, 2, 4, 0, 0), VolumeKey(11, 2, 3, 0, 0)]
    index.put_many([v.supercuboid(m) for v in ours + others for m in (0, 9)])
    assert index.volumes("1&2&3&") == ours
    assert index.volumes("1&2&") == sorted(ours + others[:2])
    assert index.volumes("") == sorted(ours + others)
    index.delete_many([ours[1].supercuboid(0), ours[1].supercuboid(9)])
    assert index.volumes("1&2&3&") == [ours[0], *ours[2:]]
