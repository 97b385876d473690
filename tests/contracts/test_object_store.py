"""The ObjectStore contract on each implementation: a local directory, S3 over real HTTP (moto's
server; once reading and writing in whole objects, once in parts), and the in-memory fake."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ndstore.storage.filestore import FileObjectStore
from ndstore.storage.interfaces import ObjectStore
from ndstore.storage.s3 import S3ObjectStore
from ndstore.testing.memory import MemoryObjectStore
from ndstore.testing.object_store import ObjectStoreContract


def ready(store: ObjectStore) -> ObjectStore:
    store.ensure_ready()
    return store


class TestFileObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> ObjectStore:
        return ready(FileObjectStore(tmp_path / "objects"))


class TestS3ObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, moto_endpoint: str) -> ObjectStore:
        return ready(S3ObjectStore(f"b-{uuid.uuid4().hex[:12]}", moto_endpoint))


class TestS3ObjectStoreInParts(ObjectStoreContract):
    """Objects over 5 MiB uploaded in parts and read in ranged GETs of 5 MiB, sent at once."""

    @pytest.fixture
    def store(self, moto_endpoint: str) -> ObjectStore:
        return ready(S3ObjectStore(f"b-{uuid.uuid4().hex[:12]}", moto_endpoint, part_bytes=5 << 20,
                                   multipart_threshold=5 << 20))


class TestMemoryObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self) -> ObjectStore:
        return ready(MemoryObjectStore())
