"""What only the local tile store does (its TileStore contract runs in tests/contracts/): the
upload URLs it signs and verifies itself, the keys it refuses, the notify queue every store on
its root announces to, and the event it sends, on SQS (moto's server) and on the SQLite queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from ndstore.core.errors import InvalidRequest
from ndstore.core.signing import BadSignature
from ndstore.storage.interfaces import WorkQueue
from ndstore.storage.local_tiles import LocalTileStore
from ndstore.storage.sqlite_queue import SqliteQueues
from ndstore.storage.sqs import SqsQueues
from ndstore.testing.tile_store import BODY, LEAVE, Tiles, read, ready_tiles
from tests.local_uploads import PUBLIC_URL, local_store, upload_metadata, upload_query

HOSTILE = ["../x", "/abs", "a//b", "a/./b", "%2e%2e", "a/b\x00c", "x" * 600, "", "a/", "a/../../b", "a b",
           "a\\b", ".", "..", "a/b/"]


@pytest.fixture(params=["sqs", "sqlite"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Tiles:
    """An empty local store, notifying a queue on SQS or on the SQLite queue."""
    queues: WorkQueue
    if request.param == "sqlite":
        queues = SqliteQueues(tmp_path / "queues.sqlite3")
    else:
        queues = SqsQueues(request.getfixturevalue("moto_endpoint"))
    return ready_tiles(local_store(tmp_path / "tiles", queues), queues)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "notify-queue.json")


def test_accept_stores_a_signed_upload(local: Tiles) -> None:
    store = local.store
    assert isinstance(store, LocalTileStore)
    target = store.upload_target("5/0/1/2/3.png", LEAVE, 60, len(BODY))
    assert target.url.startswith(f"{PUBLIC_URL}/v1/ingest/tiles/5/0/1/2/3.png?expires=")
    key, expires, size, signature = upload_query(target.url)
    reordered = {name.title(): value for name, value in reversed(upload_metadata(target.headers).items())}
    store.accept(key, expires, size, signature, reordered, BODY)  # header names arrive in any order and case
    assert read(store, [key]) == [(BODY, LEAVE)]
    assert local.announced() == [key]


def test_accept_refuses_what_was_not_signed_and_writes_nothing(local: Tiles, tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = local_store(tmp_path / "tiles", local.queues, clock=lambda: now[0])
    key, expires, size, signature = upload_query(store.upload_target("5/0/1/2/3.png", LEAVE, 60, len(BODY)).url)
    other_key, *_ = upload_query(store.upload_target("5/0/1/2/4.png", LEAVE, 60, len(BODY)).url)
    refused = [
        (key, expires, size, "0" * 64, LEAVE),  # forged
        (key, expires, size, signature[:-1], LEAVE),
        (other_key, expires, size, signature, LEAVE),  # another key
        (key, expires, size, signature, {**LEAVE, "upload-sha256": "ef" * 32}),  # changed metadata
        (key, expires, size, signature, {**LEAVE, "extra": ""}),
        (key, expires, size, signature, {k: v for k, v in LEAVE.items() if k != "upload-receipt"}),
        (key, str(int(expires) + 3600), size, signature, LEAVE),  # a later expiry
        (key, "soon", size, signature, LEAVE),
        (key, f" {expires}", size, signature, LEAVE),
        (key, "", size, signature, LEAVE),
        (key, expires, str(int(size) + 1), signature, LEAVE),  # another size
        (key, expires, "", signature, LEAVE),
    ]
    for args in refused:
        with pytest.raises(BadSignature):
            store.accept(*args, BODY)
    with pytest.raises(InvalidRequest, match="signed for"):
        store.accept(key, expires, size, signature, LEAVE, BODY + b"x")  # a body of another length
    now[0] += 61  # expired
    with pytest.raises(BadSignature):
        store.accept(key, expires, size, signature, LEAVE, BODY)
    assert _files(tmp_path / "tiles") == []
    assert store.metadata(key) is None and store.metadata(other_key) is None
    assert local.announced() == []
    now[0] -= 1  # still valid through its last second
    store.accept(key, expires, size, signature, LEAVE, BODY)
    assert store.metadata(key) == LEAVE


@pytest.mark.parametrize("key", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_keys_are_refused_before_the_disk_is_touched(local: Tiles, tmp_path: Path, key: str) -> None:
    store = local.store
    assert isinstance(store, LocalTileStore)
    before = sorted(tmp_path.rglob("*"))
    for call in (lambda: store.put(key, BODY, LEAVE), lambda: store.metadata(key),
                 lambda: read(store, ["5/0/0/0/0.png", key]),
                 lambda: store.delete_many(["5/0/0/0/0.png", key]), lambda: store.upload_target(key, LEAVE, 60, 9),
                 lambda: store.accept(key, "9" * 12, "9", "0" * 64, LEAVE, BODY)):
        with pytest.raises(InvalidRequest, match="is not a tile key"):
            call()
    assert sorted(tmp_path.rglob("*")) == before


def test_a_reopened_store_announces_to_the_configured_queue(local: Tiles, tmp_path: Path) -> None:
    again = local_store(tmp_path / "tiles", local.queues)  # another process, later: no ensure_ready
    again.put("5/0/0/0/0.png", BODY, LEAVE)
    assert local.announced() == ["5/0/0/0/0.png"]
    assert read(local.store, ["5/0/0/0/0.png"]) == [(BODY, LEAVE)]


def test_a_store_without_a_queue_announces_nothing(local: Tiles, tmp_path: Path) -> None:
    store = local_store(tmp_path / "quiet", local.queues)
    store.ensure_ready()
    store.put("5/0/0/0/0.png", BODY, LEAVE)
    assert store.metadata("5/0/0/0/0.png") == LEAVE
    assert local.announced() == []


def test_the_event_is_the_one_s3_sends(local: Tiles) -> None:
    local.store.put("5/0/1/2/3.png", BODY, LEAVE)
    [message] = local.queues.receive(local.queue_url, 10, wait_s=0)
    [record] = message.json()["Records"]
    assert record["eventSource"] == "aws:s3" and record["eventName"] == "ObjectCreated:Put"
    assert record["s3"]["bucket"]["name"] == "tiles"
    assert record["s3"]["object"]["key"] == "5%2F0%2F1%2F2%2F3.png"  # quote_plus, as lambdas/ingest.py reads it
    assert record["s3"]["object"]["size"] == len(BODY)
