"""The LabelIndex port's contract: which labels each supercuboid holds, with voxel counts, both
ways; unsettled marks; the channels it serves.

A subclass defines the fixture `labels`: an empty label index of the implementation under test,
made ready (`ensure_ready`).
"""

from __future__ import annotations

import pytest

from ndstore.core.keys import VolumeKey
from ndstore.storage.interfaces import LabelIndex

TOP = 2**64 - 1  # the largest uint64 label
HIGH = [2**63 - 1, 2**63, 2**63 + 1, TOP]  # either side of int64's end: a signed column's trap


class LabelIndexContract:
    @pytest.fixture
    def labels(self) -> LabelIndex:
        raise NotImplementedError("a subclass defines the `labels` fixture: an empty, ready label index")

    def test_records_labels_both_ways(self, labels: LabelIndex) -> None:
        v = VolumeKey(1, 2, 3, 0, 0)
        a, b = v.supercuboid(5), v.supercuboid(9)
        labels.begin({a: {7: 100, 8: 1}, b: {7: 3}}, "writing")
        labels.settle({a: [], b: []})
        assert labels.labels_of([a, b, v.supercuboid(6)]) == {a: {7: 100, 8: 1}, b: {7: 3}, v.supercuboid(6): {}}
        assert labels.supercuboids_of(v, 7) == {5: 100, 9: 3}
        assert labels.supercuboids_of(v, 8) == {5: 1}
        assert labels.supercuboids_of(v, 99) == {}
        assert labels.unsettled(v) == {}

    def test_a_rewrite_keeps_old_labels_until_it_settles(self, labels: LabelIndex) -> None:
        """The order that keeps the index a superset: new entries before the object, old ones
        dropped after; in between the supercuboid is marked and lists both."""
        v = VolumeKey(1, 1, 1, 0, 0)
        s = v.supercuboid(3)
        labels.begin({s: {1: 10, 2: 20}}, "writing")
        labels.settle({s: []})
        labels.begin({s: {2: 5, 3: 7}}, "writing")
        assert labels.labels_of([s])[s] == {1: 10, 2: 5, 3: 7}
        assert labels.unsettled(v) == {3: "writing"}
        labels.settle({s: [1]})
        assert labels.labels_of([s])[s] == {2: 5, 3: 7}
        assert labels.supercuboids_of(v, 1) == {}
        assert labels.unsettled(v) == {}

    def test_a_mark_can_stay(self, labels: LabelIndex) -> None:
        """A supercuboid with too many labels to record keeps its mark, and no entries."""
        v = VolumeKey(1, 1, 1, 0, 0)
        s = v.supercuboid(4)
        labels.begin({s: {1: 1}}, "writing")
        labels.settle({s: []})
        labels.begin({s: {}}, "dense: 70000 labels")
        labels.settle({s: [1]}, unmark=False)
        assert labels.labels_of([s])[s] == {}
        assert labels.unsettled(v) == {4: "dense: 70000 labels"}
        assert labels.indexed("1&1&1&") == [s]
        labels.begin({s: {2: 2}}, "writing")  # a later write that fits: marked as being written
        assert labels.unsettled(v) == {4: "writing"}
        labels.settle({s: []})
        assert labels.unsettled(v) == {}
        assert labels.labels_of([s])[s] == {2: 2}

    def test_uint64_labels_round_trip(self, labels: LabelIndex) -> None:
        v = VolumeKey(4, 4, 4, 0, 0)
        s, t = v.supercuboid(1), v.supercuboid(2**63 - 1)  # the largest Morton code too
        labels.begin({s: dict.fromkeys([1, *HIGH], 9), t: {TOP: 2**24}}, "writing")
        labels.settle({s: [], t: []})
        assert labels.labels_of([s])[s] == dict.fromkeys([1, *HIGH], 9)
        for label in HIGH:
            assert labels.supercuboids_of(v, label) == ({1: 9, 2**63 - 1: 2**24} if label == TOP else {1: 9})
        labels.begin({s: {}}, "deleting")
        labels.settle({s: HIGH})
        assert labels.labels_of([s])[s] == {1: 9}
        assert labels.supercuboids_of(v, TOP) == {2**63 - 1: 2**24}

    def test_volumes_and_channels_are_apart(self, labels: LabelIndex) -> None:
        """Channel 1&2&3 and channel 1&2&31 (whose ids only start alike), levels and time samples."""
        ours = [VolumeKey(1, 2, 3, 0, 0), VolumeKey(1, 2, 3, 0, 1), VolumeKey(1, 2, 3, 1, 0)]
        other = VolumeKey(1, 2, 31, 0, 0)
        labels.begin({v.supercuboid(0): {5: i + 1} for i, v in enumerate([*ours, other])}, "writing")
        labels.settle({other.supercuboid(0): []})
        for i, v in enumerate(ours):
            assert labels.supercuboids_of(v, 5) == {0: i + 1}
            assert labels.unsettled(v) == {0: "writing"}
        assert labels.unsettled(other) == {}
        assert labels.indexed("1&2&3&") == [v.supercuboid(0) for v in ours]
        assert labels.indexed("1&2&31&") == [other.supercuboid(0)]
        assert labels.indexed("1&2&3&0&1&") == [ours[1].supercuboid(0)]

    def test_deleting_every_label_forgets_the_supercuboid(self, labels: LabelIndex) -> None:
        v = VolumeKey(2, 2, 2, 0, 0)
        s = v.supercuboid(8)
        labels.begin({s: {1: 1, 2: 2}}, "writing")
        labels.settle({s: []})
        labels.begin({s: {}}, "deleting")
        labels.settle({s: [1, 2]})
        assert labels.labels_of([s])[s] == {}
        assert labels.indexed("2&2&2&") == []
        assert labels.supercuboids_of(v, 1) == {}

    def test_a_supercuboid_of_thousands_of_labels(self, labels: LabelIndex) -> None:
        """Over a hundred batches of DynamoDB writes, read back in one lookup."""
        v = VolumeKey(5, 5, 5, 0, 0)
        s = v.supercuboid(10**6)
        many = {label: label % 7 + 1 for label in range(1, 2501)}
        labels.begin({s: many}, "writing")
        labels.settle({s: []})
        assert labels.labels_of([s])[s] == many
        labels.begin({s: {}}, "deleting")
        labels.settle({s: list(many)})
        assert labels.labels_of([s])[s] == {}

    def test_a_label_in_many_supercuboids(self, labels: LabelIndex) -> None:
        """(moto answers a query in time that grows with its table: hundreds, not thousands.)"""
        v = VolumeKey(5, 5, 5, 0, 0)
        shared = {v.supercuboid(m): {TOP: m + 1} for m in range(300)}
        labels.begin(shared, "writing")
        labels.settle(dict.fromkeys(shared, ()))
        assert labels.supercuboids_of(v, TOP) == {m: m + 1 for m in range(300)}
        assert labels.labels_of(list(shared)) == {k: {TOP: k.morton + 1} for k in shared}
        assert labels.unsettled(v) == {}

    def test_registers_channels_once(self, labels: LabelIndex) -> None:
        assert labels.channel("1&2&3&") is None
        assert labels.register(["1&2&3&", "1&2&4&"], complete=True) == ["1&2&3&", "1&2&4&"]
        assert labels.register(["1&2&3&", "1&2&5&"], complete=False) == ["1&2&5&"]  # 3 stays complete
        assert (labels.channel("1&2&3&"), labels.channel("1&2&5&"), labels.channel("1&2&31&")) == (True, False, None)
        labels.set_complete(["1&2&5&", "9&9&9&"])  # one not registered: not registered by this
        assert (labels.channel("1&2&5&"), labels.channel("9&9&9&")) == (True, None)

    def test_nothing_asked_is_nothing_done(self, labels: LabelIndex) -> None:
        labels.begin({}, "writing")
        labels.settle({})
        assert labels.labels_of([]) == {}
        assert labels.register([], complete=True) == []
        labels.set_complete([])
        assert labels.indexed("") == []

    def test_ready_again_as_it_was(self, labels: LabelIndex) -> None:
        v = VolumeKey(1, 1, 1, 0, 0)
        labels.begin({v.supercuboid(1): {TOP: 2}}, "writing")
        labels.register(["1&1&1&"], complete=True)
        assert labels.ensure_ready() is None
        assert labels.ensure_ready(thorough=True) is None
        assert labels.supercuboids_of(v, TOP) == {1: 2}
        assert labels.unsettled(v) == {1: "writing"}
        assert labels.channel("1&1&1&") is True

