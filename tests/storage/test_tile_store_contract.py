"""The TileStore contract, written once and run against every implementation: S3 (moto's server
over real HTTP, notifying an SQS queue) and the local stack's directory (notifying a WorkQueue:
SQS on moto, and the SQLite queue where it exists); plus what only the local store does: the
upload URLs it signs and verifies itself, and the keys it refuses."""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit

import pytest
import requests

from ndstore.core.errors import InvalidRequest, PayloadTooLarge
from ndstore.core.signing import BadSignature, Signer
from ndstore.storage.interfaces import TileStore, WorkQueue
from ndstore.storage.local_tiles import LocalTileStore
from ndstore.storage.sqs import SqsQueues
from ndstore.storage.tile_bucket import S3TileBucket

SIGNER = Signer("x" * 32, "tile-upload")
PUBLIC_URL = "http://127.0.0.1:9"
LEAVE = {"upload-receipt": "r-1/2+3==", "upload-sha256": "ab" * 32, "upload-signature": "cd" * 32}
BODY = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) + b"\n\n" + b"\x00" * 10 + b"\n"
HAS_SQLITE_QUEUES = importlib.util.find_spec("ndstore.storage.sqlite_queue") is not None
KINDS = ["s3", "local-sqs", *(["local-sqlite"] if HAS_SQLITE_QUEUES else [])]
HOSTILE = ["../x", "/abs", "a//b", "a/./b", "%2e%2e", "a/b\x00c", "x" * 600, "", "a/", "a/../../b", "a b",
           "a\\b", ".", "..", "a/b/"]


@dataclass
class Tiles:
    store: TileStore
    queues: WorkQueue
    queue_url: str
    kind: str

    def announced(self) -> list[str]:
        """The keys of the ObjectCreated events on the notify queue since the last call."""
        keys: list[str] = []
        while messages := self.queues.receive(self.queue_url, 10, wait_s=0):
            for m in messages:
                event = m.json()
                keys += [unquote_plus(r["s3"]["object"]["key"]) for r in event.get("Records", [])
                         if r.get("eventSource") == "aws:s3" and r.get("eventName", "").startswith("ObjectCreated")]
                self.queues.delete_message(self.queue_url, m.receipt)
        return keys


def _queues(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> WorkQueue:
    if kind == "local-sqlite":
        from ndstore.storage.sqlite_queue import SqliteQueues  # type: ignore[import-not-found,unused-ignore]

        return SqliteQueues(tmp_path / "queues.sqlite3")  # type: ignore[no-any-return,unused-ignore]
    return SqsQueues(request.getfixturevalue("moto_endpoint"))


def _local(root: Path, queues: WorkQueue, clock: Callable[[], float] | None = None) -> LocalTileStore:
    if clock is None:
        return LocalTileStore(root, PUBLIC_URL, SIGNER, queues)
    return LocalTileStore(root, PUBLIC_URL, SIGNER, queues, clock=clock)


def _tiles(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Tiles:
    queues = _queues(kind, tmp_path, request)
    url = queues.create(f"tile-events-{uuid.uuid4().hex[:10]}", 30, 3)
    if kind == "s3":
        store: TileStore = S3TileBucket(f"tiles-{uuid.uuid4().hex[:12]}", request.getfixturevalue("moto_endpoint"))
    else:
        store = _local(tmp_path / "tiles", queues)
    store.ensure_ready(queues.arn(url))
    store.ensure_ready()  # idempotent, and keeps the notify queue
    harness = Tiles(store, queues, url, kind)
    harness.announced()  # S3 sends a test event when notifications are configured
    return harness


@pytest.fixture(params=KINDS)
def tiles(request: pytest.FixtureRequest, tmp_path: Path) -> Tiles:
    return _tiles(request.param, tmp_path, request)


@pytest.fixture(params=[k for k in KINDS if k != "s3"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Tiles:
    """The local store only: on SQS, and on the SQLite queue where it exists."""
    return _tiles(request.param, tmp_path, request)


def read(store: TileStore, keys: list[str], max_bytes: int = 1 << 20) -> list[tuple[bytes, dict[str, str]] | None]:
    """Each tile in the order of `keys` (the store hands them over in any order)."""
    found = dict(store.get_many_with_metadata(keys, max_bytes))
    assert sorted(found) == sorted(set(keys))
    return [found[k] for k in keys]


# -- every implementation -------------------------------------------------------------------------


def test_put_read_overwrite_round_trip(tiles: Tiles) -> None:
    store = tiles.store
    store.put("5/0/1/2/3.png", BODY, LEAVE)
    store.put("5/0/1/2/4.png", b"", {"upload-receipt": "", "other": "v"})
    assert store.metadata("5/0/1/2/3.png") == LEAVE
    assert store.metadata("5/0/1/2/4.png") == {"upload-receipt": "", "other": "v"}
    assert read(store, ["5/0/1/2/4.png", "5/0/1/2/3.png"]) == [
        (b"", {"upload-receipt": "", "other": "v"}), (BODY, LEAVE)]
    store.put("5/0/1/2/3.png", b"\n", {})
    assert read(store, ["5/0/1/2/3.png"]) == [(b"\n", {})]


def test_metadata_names_are_kept_in_lower_case(tiles: Tiles) -> None:
    tiles.store.put("5/0/1/2/3.png", BODY, {"Upload-Receipt": "R-1"})
    assert tiles.store.metadata("5/0/1/2/3.png") == {"upload-receipt": "R-1"}


def test_missing_tiles_read_as_none(tiles: Tiles) -> None:
    tiles.store.put("5/0/0/0/1.png", BODY, LEAVE)
    assert tiles.store.metadata("5/0/0/0/0.png") is None
    assert tiles.store.metadata("9/9/9/9/9.png") is None
    assert read(tiles.store, ["5/0/0/0/0.png", "5/0/0/0/1.png", "6/x.png"]) == [
        None, (BODY, LEAVE), None]
    assert list(tiles.store.get_many_with_metadata([], 1)) == []


def test_delete_many_ignores_missing_tiles(tiles: Tiles) -> None:
    keys = [f"5/0/0/{i}/{j}.png" for i in range(3) for j in range(2)]
    for key in keys:
        tiles.store.put(key, key.encode(), LEAVE)
    tiles.store.delete_many([*keys[:4], "5/0/0/0/9.png", "8/never.png"])
    assert read(tiles.store, keys) == [None] * 4 + [(k.encode(), LEAVE) for k in keys[4:]]
    tiles.store.delete_many(keys[:4])  # again
    tiles.store.delete_many([])
    tiles.store.put(keys[0], b"back", {})
    assert read(tiles.store, keys[:1]) == [(b"back", {})]


def test_each_put_is_announced_once_as_an_s3_event(tiles: Tiles) -> None:
    keys = ["5/0/1/2/3.png", "5/0/1/2/4.tif", "a-b_c.d/e.png"]
    for key in keys:
        tiles.store.put(key, BODY, LEAVE)
    tiles.store.put(keys[0], BODY, LEAVE)  # a second put is a second event
    assert Counter(tiles.announced()) == Counter([*keys, keys[0]])
    tiles.store.delete_many(keys)
    assert tiles.announced() == []


def test_upload_target_carries_the_metadata(tiles: Tiles) -> None:
    target = tiles.store.upload_target("5/0/1/2/3.png", LEAVE, 3600, len(BODY))
    assert urlsplit(target.url).scheme == "http"
    assert "5/0/1/2/3.png" in unquote(target.url)
    assert target.headers == {f"x-amz-meta-{k}": v for k, v in LEAVE.items()}
    assert tiles.store.metadata("5/0/1/2/3.png") is None  # a target stores nothing


def test_head_says_the_size_and_when_without_reading(tiles: Tiles) -> None:
    before = time.time()
    tiles.store.put("5/0/1/2/3.png", BODY, LEAVE)
    head = tiles.store.head("5/0/1/2/3.png")
    assert head is not None and head.metadata == LEAVE and head.size == len(BODY)
    assert before - 1 <= head.stored_at <= time.time() + 1  # S3's Last-Modified is to the second
    assert tiles.store.head("5/0/1/2/4.png") is None


def test_a_tile_over_the_bound_is_refused_by_its_size(tiles: Tiles) -> None:
    tiles.store.put("5/0/0/0/0.png", BODY, LEAVE)
    tiles.store.put("5/0/0/0/1.png", BODY + b"x", LEAVE)
    assert read(tiles.store, ["5/0/0/0/0.png"], len(BODY)) == [(BODY, LEAVE)]
    with pytest.raises(PayloadTooLarge, match=f"holds {len(BODY) + 1} bytes"):
        read(tiles.store, ["5/0/0/0/0.png", "5/0/0/0/1.png"], len(BODY))


def test_a_key_may_be_a_tile_and_a_folder_of_tiles(tiles: Tiles) -> None:
    tiles.store.put("a/b", b"1", {})
    tiles.store.put("a/b/c", b"2", {})
    assert read(tiles.store, ["a/b", "a/b/c", "a"]) == [(b"1", {}), (b"2", {}), None]
    tiles.store.delete_many(["a/b/c", "a/b"])
    assert read(tiles.store, ["a/b", "a/b/c"]) == [None, None]


# -- S3 only ------------------------------------------------------------------------------------


def test_s3_stores_an_http_put_to_its_upload_target(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    tiles = _tiles("s3", tmp_path, request)
    target = tiles.store.upload_target("5/0/1/2/3.png", LEAVE, 3600, len(BODY))
    reply = requests.put(target.url, data=BODY, headers=target.headers, timeout=30)
    assert reply.status_code == 200, reply.text
    assert read(tiles.store, ["5/0/1/2/3.png"]) == [(BODY, LEAVE)]
    assert tiles.announced() == ["5/0/1/2/3.png"]


# -- the local store only -------------------------------------------------------------------------


def _query(url: str) -> tuple[str, str, str, str]:
    """The key, expires, size and signature of a local upload URL, as the service's route reads them."""
    parts = urlsplit(url)
    assert parts.path.startswith("/v1/ingest/tiles/")
    query = parse_qs(parts.query)
    return (unquote(parts.path.removeprefix("/v1/ingest/tiles/")), query["expires"][0], query["size"][0],
            query["signature"][0])


def _metadata(headers: dict[str, str]) -> dict[str, str]:
    return {name.removeprefix("x-amz-meta-"): value for name, value in headers.items()}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "notify-queue.json")


def test_accept_stores_a_signed_upload(local: Tiles) -> None:
    store = local.store
    assert isinstance(store, LocalTileStore)
    target = store.upload_target("5/0/1/2/3.png", LEAVE, 60, len(BODY))
    assert target.url.startswith(f"{PUBLIC_URL}/v1/ingest/tiles/5/0/1/2/3.png?expires=")
    key, expires, size, signature = _query(target.url)
    reordered = {name.title(): value for name, value in reversed(_metadata(target.headers).items())}
    store.accept(key, expires, size, signature, reordered, BODY)  # header names arrive in any order and case
    assert read(store, [key]) == [(BODY, LEAVE)]
    assert local.announced() == [key]


def test_accept_refuses_what_was_not_signed_and_writes_nothing(local: Tiles, tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = _local(tmp_path / "tiles", local.queues, clock=lambda: now[0])
    key, expires, size, signature = _query(store.upload_target("5/0/1/2/3.png", LEAVE, 60, len(BODY)).url)
    other_key, *_ = _query(store.upload_target("5/0/1/2/4.png", LEAVE, 60, len(BODY)).url)
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
    again = _local(tmp_path / "tiles", local.queues)  # another process, later: no ensure_ready
    again.put("5/0/0/0/0.png", BODY, LEAVE)
    assert local.announced() == ["5/0/0/0/0.png"]
    assert read(local.store, ["5/0/0/0/0.png"]) == [(BODY, LEAVE)]


def test_a_store_without_a_queue_announces_nothing(local: Tiles, tmp_path: Path) -> None:
    store = _local(tmp_path / "quiet", local.queues)
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
