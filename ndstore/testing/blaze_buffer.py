"""The NDBlaze buffer's ports' contract (BlazeBuffer, MergeRequests, MergerPresence): order,
atomic snapshots, idempotent releases, back-pressure, the mark of a checked run, requests, the
heartbeat's expiry, damage refused, and every failure of the backend a StorageError.

A subclass defines the fixtures `fresh_ports` (the three ports of one empty backend, the buffer
refusing writes past `LIMIT` pending bytes, its run not checked yet) and `away` (ports of a backend
that does not answer), and the hook `damage` (flip a byte of a stored body, as a damaged disk
would). The suite's `ports` are `fresh_ports` with the run checked as "run-1" at seq 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from ndstore.core.errors import BufferFull, DataCorrupt, RedisUnverified, StorageError
from ndstore.storage.interfaces import BlazeBuffer, MergeRequests, MergerPresence

LIMIT = 1 << 20


@dataclass
class Ports:
    buffer: BlazeBuffer
    requests: MergeRequests
    presence: MergerPresence


class BlazeBufferContract:
    @pytest.fixture
    def fresh_ports(self) -> Ports:
        raise NotImplementedError("a subclass defines `fresh_ports`: the ports of one empty backend, limit LIMIT")

    @pytest.fixture
    def away(self) -> Ports:
        raise NotImplementedError("a subclass defines `away`: ports whose backend does not answer")

    def damage(self, ports: Ports, seq: int) -> None:
        """Change a byte of the stored body of ``seq``, behind the ports' back."""
        raise NotImplementedError("a subclass says how a stored body is damaged")

    @pytest.fixture
    def ports(self, fresh_ports: Ports) -> Ports:
        fresh_ports.buffer.start_epoch("run-1", 0)  # a checked run (ndstore/engine/ledger.py)
        return fresh_ports

    def test_appends_are_ordered_and_indexed_under_every_name(self, ports: Ports) -> None:
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

    def test_a_blob_goes_once_every_name_released_it_and_releasing_twice_changes_nothing(self, ports: Ports) -> None:
        b = ports.buffer
        seq = b.append(b"h", b"body", ["a", "b"])
        assert b.release("a", [seq]) == 1 and b.release("a", [seq]) == 0
        assert [p.seq for p in b.blobs([seq])] == [seq]  # still needed by b
        assert b.release("b", [seq]) == 1
        assert b.blobs([seq]) == [] and b.pending_names() == [] and b.stats().pending_bytes == 0

    def test_back_pressure_refuses_a_whole_write_past_the_limit(self, ports: Ports) -> None:
        b = ports.buffer
        b.append(b"h", b"x" * (900 << 10), ["a"])
        with pytest.raises(BufferFull):
            b.append(b"h", b"y" * (200 << 10), ["a"])
        assert b.stats().blobs == 1

    def test_merge_requests_are_taken_once_and_report_their_state(self, ports: Ports) -> None:
        r = ports.requests
        ids = [r.request_merge(), r.request_merge()]
        assert [x["id"] for x in r.take_merge_requests()] == ids and r.take_merge_requests() == []
        assert r.merge_status(ids[0])["state"] == "queued"  # type: ignore[index]
        r.set_merge_status(ids[0], {"state": "done"})
        assert r.merge_status(ids[0]) == {"state": "done"} and r.merge_status("nope") is None

    def test_the_mergers_announcement_expires_without_beats(self, ports: Ports) -> None:
        p = ports.presence
        assert p.merger() is None
        p.announce_merger({"pid": 7}, ttl_s=0.3)
        assert p.merger() == {"pid": 7}
        time.sleep(0.5)
        assert p.merger() is None
        p.announce_merger({"pid": 8}, ttl_s=30)
        p.retire_merger()
        assert p.merger() is None

    def test_every_call_on_a_buffer_that_is_away_is_a_storage_error(self, away: Ports) -> None:
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

    def test_held_names_the_newest_pending_seq_of_each_supercuboid(self, ports: Ports) -> None:
        b = ports.buffer
        first = b.append(b"h1", b"one", ["a", "b"])
        second = b.append(b"h2", b"two", ["b"])
        held = b.held()
        assert (held.epoch, held.seq, held.unflushed) == ("run-1", second, {"a": first, "b": second})
        b.release("b", [first, second])
        assert b.held().unflushed == {"a": first}

    def test_without_the_mark_of_a_checked_run_nothing_is_stored_or_read(self, ports: Ports) -> None:
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

    def test_drop_all_but_releases_every_other_supercuboids_blobs(self, ports: Ports) -> None:
        b = ports.buffer
        shared = b.append(b"h", b"one", ["a", "b"])
        b.append(b"h", b"two", ["c"])
        assert b.drop_all_but(frozenset({"a"})) == 2
        assert b.pending_names() == ["a"] and [p.seq for p in b.blobs([shared])] == [shared]
        assert b.stats().blobs == 1

    def test_a_body_damaged_in_the_buffer_is_refused_never_returned(self, ports: Ports) -> None:
        b = ports.buffer
        seq = b.append(b"h", b"the body as it arrived", ["a"])
        self.damage(ports, seq)
        with pytest.raises(DataCorrupt, match=f"write {seq} is damaged"):
            b.blobs([seq])

    def test_a_fresh_buffer_is_unchecked_and_empty(self, fresh_ports: Ports) -> None:
        b = fresh_ports.buffer
        assert b.mark() is None
        held = b.held()
        assert (held.epoch, held.seq, held.unflushed) == (None, 0, {})
        with pytest.raises(RedisUnverified):
            b.append(b"h", b"body", ["a"])
        stats = b.stats()
        assert (stats.pending_bytes, stats.blobs, stats.supercuboids, stats.oldest_age_s) == (0, 0, 0, None)
        assert stats.as_dict() == {"pending_bytes": 0, "blobs": 0, "supercuboids": 0, "oldest_age_s": None}

    def test_append_in_run_names_the_checked_run(self, ports: Ports) -> None:
        b = ports.buffer
        assert b.mark() == "run-1"
        seq, run = b.append_in_run(b"h", b"one", ["a"])
        assert run == "run-1" and b.pending_seqs(["a"]) == {"a": [seq]}
        b.start_epoch("run-2", 0)  # a later check: numbering goes on
        assert b.mark() == "run-2"
        later, run = b.append_in_run(b"h", b"two", ["a"])
        assert (later > seq, run) == (True, "run-2")
        b.clear_epoch()
        assert b.mark() is None

    def test_pending_names_come_oldest_first(self, ports: Ports) -> None:
        b = ports.buffer
        for name in ("z", "m", "a"):
            b.append(b"h", name.encode(), [name])
        b.append(b"h", b"again", ["z"])
        b.append(b"h", b"b", ["b"])
        assert b.pending_names() == ["z", "m", "a", "b"]
        assert b.pending_names(limit=2) == ["z", "m"] and b.pending_names("m") == ["m"]
        first = b.pending_seqs(["z"])["z"][0]
        b.release("z", [first])  # z's oldest pending write is now its second: the newest of all
        assert b.pending_names() == ["m", "a", "z", "b"]

    def test_blobs_of_unknown_seqs_and_releases_of_unknown_names_are_nothing(self, ports: Ports) -> None:
        b = ports.buffer
        seq = b.append(b"h", b"body", ["a"])
        assert [p.seq for p in b.blobs([seq + 1, seq, 10**9])] == [seq]
        assert b.blobs([]) == []
        assert b.release("nobody", [seq]) == 0 and b.release("a", []) == 0
        assert b.pending_seqs([]) == {} and b.pending_seqs(["a"]) == {"a": [seq]}

    def test_stats_count_the_bytes_names_and_age_of_the_oldest(self, ports: Ports) -> None:
        b = ports.buffer
        b.append(b"header", b"x" * 1000, ["a", "b", "c"])
        b.append(b"header", b"y" * 24, ["c"])
        stats = b.stats()
        assert (stats.pending_bytes, stats.blobs, stats.supercuboids) == (1024, 2, 3)
        assert stats.oldest_age_s is not None and 0 <= stats.oldest_age_s < 60

    def test_a_write_larger_than_the_limit_is_taken_by_an_empty_buffer(self, ports: Ports) -> None:
        """Else it could never be taken; the next write waits for a merge."""
        b = ports.buffer
        b.append(b"h", b"x" * (LIMIT + 1), ["a"])
        with pytest.raises(BufferFull):
            b.append(b"h", b"y", ["a"])
        assert b.stats().blobs == 1

    def test_drop_all_but_nothing_drops_everything(self, ports: Ports) -> None:
        b = ports.buffer
        b.append(b"h", b"one", ["a", "b"])
        b.append(b"h", b"two", ["c"])
        assert b.drop_all_but(frozenset()) == 3
        assert b.pending_names() == [] and b.stats().blobs == 0 and b.held().unflushed == {}
        assert b.drop_all_but(frozenset()) == 0
