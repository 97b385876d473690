"""The SQLite index file damaged under the processes that share it: the first to make the index
ready sets the file aside and begins an empty one, once; every other process (here: another
adapter on the same file, with its connection open) goes on with the new file, never the old."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ndstore.core.errors import StorageError
from ndstore.core.keys import VolumeKey
from ndstore.storage.sqlite_index import SqliteSupercuboidIndex

VOLUME = VolumeKey(1, 2, 3, 0, 0)


def filled(path: Path) -> SqliteSupercuboidIndex:
    """An index of 20,000 entries (about 240 pages), its WAL checkpointed into the file."""
    index = SqliteSupercuboidIndex(path)
    assert index.ensure_ready() is None
    index.put_many([VOLUME.supercuboid(m) for m in range(20000)])
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return index


def kept(path: Path) -> list[Path]:
    return [p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]


@pytest.mark.parametrize("how", ["garbage", "last page cut", "half cut"])
def test_a_damaged_file_is_set_aside_once_and_every_process_moves_to_the_new_one(tmp_path: Path, how: str) -> None:
    path = tmp_path / "index.sqlite3"
    first = filled(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # in place, under the open connection of `first`
        if how == "garbage":
            f.write(b"\x5a" * size)
        else:
            f.truncate(size - 4096 if how == "last page cut" else size // 2)
    damaged = path.read_bytes()

    second = SqliteSupercuboidIndex(path)
    found = second.ensure_ready()
    assert found is not None and str(path) in found and "moved aside to" in found, found
    assert first.ensure_ready() is None  # another process: the file there now is sound
    [aside] = kept(path)
    assert aside.read_bytes() == damaged and str(aside) in found

    first.put_many([VOLUME.supercuboid(7)])
    assert second.mortons(VOLUME) == [7]  # both write and read the new file
    assert second.ensure_ready() is None and len(kept(path)) == 1


def test_a_damaged_page_inside_is_found_by_the_full_check_and_by_queries_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite3"
    filled(path)
    with open(path, "r+b") as f:  # a leaf page in the middle: the header and the size stay right
        f.seek(100 * 4096)
        f.write(b"\xff" * 4096)
    index = SqliteSupercuboidIndex(path)
    assert index.ensure_ready() is None  # the cheap check (every start) does not read every page
    with pytest.raises(StorageError, match=r"index\.sqlite3 cannot be used: .*malformed.*`ndstore reindex` sets"):
        index.mortons(VOLUME)
    found = index.ensure_ready(thorough=True)  # what `ndstore reindex` does first
    assert found is not None and "malformed" in found and len(kept(path)) == 1
    assert index.mortons(VOLUME) == []
