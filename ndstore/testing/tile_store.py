"""The TileStore port's contract: the ingest's uploaded tiles with their metadata, an upload
target for an uploader with no credentials, and an S3 ObjectCreated event for each new tile.

A subclass defines the fixture `tiles`: a `Tiles` of an empty store of the implementation under
test, made ready with a fresh notify queue (`ready_tiles` does that), and the hook
`put_to_target`: how an uploader's HTTP PUT to an upload target reaches the store.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus, urlsplit

import pytest

from ndstore.core.errors import PayloadTooLarge
from ndstore.storage.interfaces import TileStore, UploadTarget, WorkQueue

LEAVE = {"upload-receipt": "r-1/2+3==", "upload-sha256": "ab" * 32, "upload-signature": "cd" * 32}
BODY = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) + b"\n\n" + b"\x00" * 10 + b"\n"


@dataclass
class Tiles:
    store: TileStore
    queues: WorkQueue
    queue_url: str

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


def ready_tiles(store: TileStore, queues: WorkQueue) -> Tiles:
    """The store made ready (twice: idempotent, and keeping its notify queue) with a new notify
    queue on ``queues``, which has no event yet."""
    url = queues.create(f"tile-events-{uuid.uuid4().hex[:10]}", 30, 3)
    store.ensure_ready(queues.arn(url))
    store.ensure_ready()
    harness = Tiles(store, queues, url)
    harness.announced()  # S3 sends a test event when notifications are configured
    return harness


def read(store: TileStore, keys: list[str], max_bytes: int = 1 << 20) -> list[tuple[bytes, dict[str, str]] | None]:
    """Each tile in the order of `keys` (the store hands them over in any order)."""
    found = dict(store.get_many_with_metadata(keys, max_bytes))
    assert sorted(found) == sorted(set(keys))
    return [found[k] for k in keys]


class TileStoreContract:
    @pytest.fixture
    def tiles(self) -> Tiles:
        raise NotImplementedError("a subclass defines the `tiles` fixture (see ready_tiles)")

    def put_to_target(self, tiles: Tiles, target: UploadTarget, body: bytes) -> None:
        """Send ``body`` as an uploader does: an HTTP PUT to ``target.url`` with ``target.headers``."""
        raise NotImplementedError("a subclass says how an upload reaches the store")

    def test_put_read_overwrite_round_trip(self, tiles: Tiles) -> None:
        store = tiles.store
        store.put("5/0/1/2/3.png", BODY, LEAVE)
        store.put("5/0/1/2/4.png", b"", {"upload-receipt": "", "other": "v"})
        assert store.metadata("5/0/1/2/3.png") == LEAVE
        assert store.metadata("5/0/1/2/4.png") == {"upload-receipt": "", "other": "v"}
        assert read(store, ["5/0/1/2/4.png", "5/0/1/2/3.png"]) == [
            (b"", {"upload-receipt": "", "other": "v"}), (BODY, LEAVE)]
        store.put("5/0/1/2/3.png", b"\n", {})
        assert read(store, ["5/0/1/2/3.png"]) == [(b"\n", {})]

    def test_metadata_names_are_kept_in_lower_case(self, tiles: Tiles) -> None:
        tiles.store.put("5/0/1/2/3.png", BODY, {"Upload-Receipt": "R-1"})
        assert tiles.store.metadata("5/0/1/2/3.png") == {"upload-receipt": "R-1"}

    def test_missing_tiles_read_as_none(self, tiles: Tiles) -> None:
        tiles.store.put("5/0/0/0/1.png", BODY, LEAVE)
        assert tiles.store.metadata("5/0/0/0/0.png") is None
        assert tiles.store.metadata("9/9/9/9/9.png") is None
        assert read(tiles.store, ["5/0/0/0/0.png", "5/0/0/0/1.png", "6/x.png"]) == [
            None, (BODY, LEAVE), None]
        assert list(tiles.store.get_many_with_metadata([], 1)) == []

    def test_delete_many_ignores_missing_tiles(self, tiles: Tiles) -> None:
        keys = [f"5/0/0/{i}/{j}.png" for i in range(3) for j in range(2)]
        for key in keys:
            tiles.store.put(key, key.encode(), LEAVE)
        tiles.store.delete_many([*keys[:4], "5/0/0/0/9.png", "8/never.png"])
        assert read(tiles.store, keys) == [None] * 4 + [(k.encode(), LEAVE) for k in keys[4:]]
        tiles.store.delete_many(keys[:4])  # again
        tiles.store.delete_many([])
        tiles.store.put(keys[0], b"back", {})
        assert read(tiles.store, keys[:1]) == [(b"back", {})]

    def test_each_put_is_announced_once_as_an_s3_event(self, tiles: Tiles) -> None:
        keys = ["5/0/1/2/3.png", "5/0/1/2/4.tif", "a-b_c.d/e.png"]
        for key in keys:
            tiles.store.put(key, BODY, LEAVE)
        tiles.store.put(keys[0], BODY, LEAVE)  # a second put is a second event
        assert Counter(tiles.announced()) == Counter([*keys, keys[0]])
        tiles.store.delete_many(keys)
        assert tiles.announced() == []

    def test_upload_target_carries_the_metadata(self, tiles: Tiles) -> None:
        target = tiles.store.upload_target("5/0/1/2/3.png", LEAVE, 3600, len(BODY))
        assert urlsplit(target.url).scheme in ("http", "https")
        assert "5/0/1/2/3.png" in unquote(target.url)
        assert target.headers == {f"x-amz-meta-{k}": v for k, v in LEAVE.items()}
        assert tiles.store.metadata("5/0/1/2/3.png") is None  # a target stores nothing

    def test_head_says_the_size_and_when_without_reading(self, tiles: Tiles) -> None:
        before = time.time()
        tiles.store.put("5/0/1/2/3.png", BODY, LEAVE)
        head = tiles.store.head("5/0/1/2/3.png")
        assert head is not None and head.metadata == LEAVE and head.size == len(BODY)
        assert before - 1 <= head.stored_at <= time.time() + 1  # S3's Last-Modified is to the second
        assert tiles.store.head("5/0/1/2/4.png") is None

    def test_a_tile_over_the_bound_is_refused_by_its_size(self, tiles: Tiles) -> None:
        tiles.store.put("5/0/0/0/0.png", BODY, LEAVE)
        tiles.store.put("5/0/0/0/1.png", BODY + b"x", LEAVE)
        assert read(tiles.store, ["5/0/0/0/0.png"], len(BODY)) == [(BODY, LEAVE)]
        with pytest.raises(PayloadTooLarge, match=f"holds {len(BODY) + 1} bytes"):
            read(tiles.store, ["5/0/0/0/0.png", "5/0/0/0/1.png"], len(BODY))

    def test_a_key_may_be_a_tile_and_a_folder_of_tiles(self, tiles: Tiles) -> None:
        tiles.store.put("a/b", b"1", {})
        tiles.store.put("a/b/c", b"2", {})
        assert read(tiles.store, ["a/b", "a/b/c", "a"]) == [(b"1", {}), (b"2", {}), None]
        tiles.store.delete_many(["a/b/c", "a/b"])
        assert read(tiles.store, ["a/b", "a/b/c"]) == [None, None]

    def test_an_upload_to_its_target_is_stored_and_announced(self, tiles: Tiles) -> None:
        target = tiles.store.upload_target("5/0/1/2/3.png", LEAVE, 3600, len(BODY))
        self.put_to_target(tiles, target, BODY)
        assert read(tiles.store, ["5/0/1/2/3.png"]) == [(BODY, LEAVE)]
        assert tiles.announced() == ["5/0/1/2/3.png"]

    def test_head_and_metadata_follow_overwrites_and_deletes(self, tiles: Tiles) -> None:
        tiles.store.put("5/0/0/0/0.png", BODY, LEAVE)
        tiles.store.put("5/0/0/0/0.png", b"short", {"other": "v"})
        head = tiles.store.head("5/0/0/0/0.png")
        assert head is not None and (head.metadata, head.size) == ({"other": "v"}, 5)
        assert tiles.store.metadata("5/0/0/0/0.png") == {"other": "v"}
        tiles.store.delete_many(["5/0/0/0/0.png"])
        assert tiles.store.head("5/0/0/0/0.png") is None and tiles.store.metadata("5/0/0/0/0.png") is None

    def test_many_tiles_are_read_as_the_caller_takes_them(self, tiles: Tiles) -> None:
        keys = [f"5/0/0/{i // 8}/{i % 8}.png" for i in range(24)]
        for i, key in enumerate(keys):
            tiles.store.put(key, bytes([i]) * (8 << 10), {"n": str(i)})
        taken = 0
        for key, found in tiles.store.get_many_with_metadata(keys, 1 << 20):
            i = keys.index(key)
            assert found == (bytes([i]) * (8 << 10), {"n": str(i)})
            taken += 1
        assert taken == len(keys)
