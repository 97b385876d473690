"""What only the file object store promises (its ObjectStore contract runs in tests/contracts/):
a key is a safe relative name, never a path out of its root."""

from __future__ import annotations

from pathlib import Path

import pytest

from ndstore.storage.filestore import FileObjectStore


def test_file_store_refuses_unsafe_keys(tmp_path: Path) -> None:
    s = FileObjectStore(tmp_path)
    for bad in ["../escape", "/abs", ""]:
        with pytest.raises(ValueError, match="not a safe relative path"):
            s.put_many({bad: b"x"})
