"""The TileStore contract on each implementation: S3 over real HTTP (moto's server, notifying an
SQS queue; uploads are real HTTP PUTs to presigned URLs), and the local stack's directory
notifying a WorkQueue, SQS on moto or the SQLite queue (uploads as the service's route takes
them: `LocalTileStore.accept`)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import requests

from ndstore.storage.interfaces import UploadTarget
from ndstore.storage.local_tiles import LocalTileStore
from ndstore.storage.sqlite_queue import SqliteQueues
from ndstore.storage.sqs import SqsQueues
from ndstore.storage.tile_bucket import S3TileBucket
from ndstore.testing.tile_store import Tiles, TileStoreContract, ready_tiles
from tests.local_uploads import local_store, upload_metadata, upload_query


class TestS3TileBucket(TileStoreContract):
    @pytest.fixture
    def tiles(self, moto_endpoint: str) -> Tiles:
        return ready_tiles(S3TileBucket(f"tiles-{uuid.uuid4().hex[:12]}", moto_endpoint), SqsQueues(moto_endpoint))

    def put_to_target(self, tiles: Tiles, target: UploadTarget, body: bytes) -> None:
        reply = requests.put(target.url, data=body, headers=target.headers, timeout=30)
        assert reply.status_code == 200, reply.text


class LocalTileStoreContract(TileStoreContract):
    def put_to_target(self, tiles: Tiles, target: UploadTarget, body: bytes) -> None:
        assert isinstance(tiles.store, LocalTileStore)
        tiles.store.accept(*upload_query(target.url), upload_metadata(target.headers), body)


class TestLocalTileStoreOnSqs(LocalTileStoreContract):
    @pytest.fixture
    def tiles(self, tmp_path: Path, moto_endpoint: str) -> Tiles:
        queues = SqsQueues(moto_endpoint)
        return ready_tiles(local_store(tmp_path / "tiles", queues), queues)


class TestLocalTileStoreOnSqlite(LocalTileStoreContract):
    @pytest.fixture
    def tiles(self, tmp_path: Path) -> Tiles:
        queues = SqliteQueues(tmp_path / "queues.sqlite3")
        return ready_tiles(local_store(tmp_path / "tiles", queues), queues)
