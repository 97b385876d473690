"""The NDBlaze buffer's ports (BlazeBuffer, MergeRequests, MergerPresence), written once against
the protocols and run on their implementation, a real redis-server: order, atomic snapshots,
idempotent releases, back-pressure, requests, the heartbeat's expiry, and every failure of the
buffer's Redis a StorageError."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from ndstore.core.errors import BufferFull, DataCorrupt, RedisUnverified, StorageError
from ndstore.storage.blaze_buffer import RedisBlazeBuffer, RedisMergeRequests, RedisMergerPresence, blob_key
from ndstore.storage.interfaces import BlazeBuffer, MergeRequests, MergerPresence
from tests.round_trips import RoundTrips


@dataclass
class Ports:
    buffer: BlazeBuffer
    requests: MergeRequests
    presence: MergerPresence


def redis_ports(url: str, limit: int) -> Ports:
    client = redis.Redis.from_url(url)
    client.flushdb()
    buffer = RedisBlazeBuffer(client, limit)
    buffer.start_epoch("run-1", 0)  # a checked run (ndstore/engine/ledger.py)
    return Ports(buffer, RedisMergeRequests(client), RedisMergerPresence(client))


IMPLEMENTATIONS: dict[str, Callable[[str, int], Ports]] = {"redis": redis_ports}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def ports(request: pytest.FixtureRequest, blaze_redis_url: str) -> Ports:
    return IMPLEMENTATIONS[request.param](blaze_redis_url, 1 << 20)


def test_appends_are_ordered_and_indexed_under_every_name(ports: Ports) -> None:
    b = ports.buffer
    first = b.append(b"h1", b"one", ["a", "b"])
    second = b.append(b"h2", b"two", ["b"])
    assert second > first
    assert b.pending_seqs(["a", "b", "c"]) == {"a": [first], "b": [first, second], "c": []}
    assert [(p.seq, p.header, p.body) for p in b.blobs([second, first])] == [(first, b"h1", b"one"),
                                                                             (second, b"h2", b"two")]
    assert b.pending_names() == ["a", "b"] and b.pending_names("b") == ["b"] and b.pending_names(limit=1) == ["a"]
    stats = b.stats()
    assert (stats.pending_bytes, stats.blobs, stats.supercuboids) == (6, 2, 2)


def test_a_blob_goes_once_every_name_released_it_and_releasing_twice_changes_nothing(ports: Ports) -> None:
    b = ports.buffer
    seq = b.append(b"h", b"body", ["a", "b"])
    assert b.release("a", [seq]) == 1 and b.release("a", [seq]) == 0
    assert [p.seq for p in b.blobs([seq])] == [seq]  # still needed by b
    assert b.release("b", [seq]) == 1
    assert b.blobs([seq]) == [] and b.pending_names() == [] and b.stats().pending_bytes == 0


def test_back_pressure_refuses_a_whole_write_past_the_limit(ports: Ports) -> None:
    b = ports.buffer
    b.append(b"h", b"x" * (900 << 10), ["a"])
    with pytest.raises(BufferFull):
        b.append(b"h", b"y" * (200 << 10), ["a"])
    assert b.stats().blobs == 1


def test_merge_requests_are_taken_once_and_report_their_state(ports: Ports) -> None:
    r = ports.requests
    ids = [r.request_merge(), r.request_merge()]
    assert [x["id"] for x in r.take_merge_requests()] == ids and r.take_merge_requests() == []
    assert r.merge_status(ids[0])["state"] == "queued"  # type: ignore[index]
    r.set_merge_status(ids[0], {"state": "done"})
    assert r.merge_status(ids[0]) == {"state": "done"} and r.merge_status("nope") is None


def test_the_mergers_announcement_expires_without_beats(ports: Ports) -> None:
    p = ports.presence
    assert p.merger() is None
    p.announce_merger({"pid": 7}, ttl_s=0.3)
    assert p.merger() == {"pid": 7}
    time.sleep(0.5)
    assert p.merger() is None
    p.announce_merger({"pid": 8}, ttl_s=30)
    p.retire_merger()
    assert p.merger() is None


def test_every_call_on_a_buffer_whose_redis_is_away_is_a_storage_error() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    away = Ports(RedisBlazeBuffer(client, 1 << 20), RedisMergeRequests(client), RedisMergerPresence(client))
    calls: list[Callable[[], object]] = [
        lambda: away.buffer.append(b"h", b"b", ["a"]), lambda: away.buffer.pending_seqs(["a"]),
        lambda: away.buffer.blobs([1]), lambda: away.buffer.release("a", [1]), away.buffer.pending_names,
        away.buffer.stats, away.requests.request_merge, away.requests.take_merge_requests,
        lambda: away.requests.merge_status("x"), lambda: away.presence.announce_merger({}, 1),
        away.presence.retire_merger, away.presence.merger,
    ]
    for call in calls:
        with pytest.raises(StorageError):
            call()


def test_held_names_the_newest_pending_seq_of_each_supercuboid(ports: Ports) -> None:
    b = ports.buffer
    first = b.append(b"h1", b"one", ["a", "b"])
    second = b.append(b"h2", b"two", ["b"])
    held = b.held()
    assert (held.epoch, held.seq, held.unflushed) == ("run-1", second, {"a": first, "b": second})
    b.release("b", [first, second])
    assert b.held().unflushed == {"a": first}


def test_without_the_mark_of_a_checked_run_nothing_is_stored_or_read(ports: Ports) -> None:
    b = ports.buffer
    seq = b.append(b"h", b"body", ["a"])
    b.clear_epoch()
    with pytest.raises(RedisUnverified):
        b.append(b"h", b"more", ["a"])
    with pytest.raises(RedisUnverified):
        b.pending_seqs(["a"])
    assert b.held().epoch is None and b.held().unflushed == {"a": seq}  # the refused write left nothing
    b.start_epoch("run-2", 100)
    assert b.append(b"h", b"again", ["a"]) == 101  # numbered past what the ledger knew
    assert b.held().epoch == "run-2"


def test_drop_all_but_releases_every_other_supercuboids_blobs(ports: Ports) -> None:
    b = ports.buffer
    shared = b.append(b"h", b"one", ["a", "b"])
    b.append(b"h", b"two", ["c"])
    assert b.drop_all_but(frozenset({"a"})) == 2
    assert b.pending_names() == ["a"] and [p.seq for p in b.blobs([shared])] == [shared]
    assert b.stats().blobs == 1


def test_a_body_damaged_in_the_buffer_is_refused_never_returned(ports: Ports, blaze_redis_url: str) -> None:
    b = ports.buffer
    seq = b.append(b"h", b"the body as it arrived", ["a"])
    client = redis.Redis.from_url(blaze_redis_url)
    client.setrange(f"{blob_key(seq)}:0", 4, b"X")  # a flipped byte, as a damaged AOF would load it
    with pytest.raises(DataCorrupt, match=f"write {seq} is damaged"):
        b.blobs([seq])


def test_an_append_is_one_round_trip(blaze_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small NDBlaze write waits for one reply: redis-py checks a registered script in a pipeline
    with SCRIPT EXISTS before it sends the pipeline (a second round trip on every write)."""
    ports = redis_ports(blaze_redis_url, 1 << 20)
    trips = RoundTrips(monkeypatch)
    for i in range(3):  # the first too: Redis may not know the script yet
        sent, seq = trips.during(lambda i=i: ports.buffer.append(b"{}", bytes([i]) * 100, ["sc-a", "sc-b"]))
        assert sent == 1 and seq == i + 1
