"""The SupercuboidIndex port's contract: which supercuboids are stored, by volume and Morton code.

A subclass defines the fixture `index`: an empty index of the implementation under test, made
ready (`ensure_ready`).
"""

from __future__ import annotations

import pytest

from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.storage.interfaces import SupercuboidIndex


class SupercuboidIndexContract:
    @pytest.fixture
    def index(self) -> SupercuboidIndex:
        raise NotImplementedError("a subclass defines the `index` fixture: an empty, ready index")

    def test_tracks_puts_and_deletes_per_volume(self, index: SupercuboidIndex) -> None:
        a, b = VolumeKey(1, 2, 3, 0, 0), VolumeKey(1, 2, 3, 1, 0)
        mortons = [0, 7, 2**62 + 5, 64, 9]
        index.put_many([a.supercuboid(m) for m in mortons] + [b.supercuboid(1)])
        index.put_many([a.supercuboid(7)])  # idempotent
        assert index.mortons(a) == sorted(mortons)
        assert index.mortons(b) == [1]
        index.delete_many([a.supercuboid(7), a.supercuboid(12345)])
        assert index.mortons(a) == sorted(set(mortons) - {7})
        assert index.mortons(VolumeKey(9, 9, 9, 9, 9)) == []

    def test_pages_through_many_items(self, index: SupercuboidIndex) -> None:
        v = VolumeKey(5, 5, 5, 0, 3)
        keys = [SupercuboidKey(v, m) for m in range(0, 3000, 3)]
        index.put_many(keys)
        assert index.mortons(v) == [k.morton for k in keys]

    def test_lists_a_channels_volumes_by_prefix(self, index: SupercuboidIndex) -> None:
        """Every level and time sample of channel 1&2&3 (not channel 1&2&31, whose ids only start
        alike), however many the experiment declares: what a channel delete purges."""
        ours = [VolumeKey(1, 2, 3, res, t) for res, t in [(0, 0), (0, 3), (4, 0), (12, 7)]]
        others = [VolumeKey(1, 2, 31, 0, 0), VolumeKey(1, 2, 4, 0, 0), VolumeKey(11, 2, 3, 0, 0)]
        index.put_many([v.supercuboid(m) for v in ours + others for m in (0, 9)])
        assert index.volumes("1&2&3&") == ours
        assert index.volumes("1&2&") == sorted(ours + others[:2])
        assert index.volumes("") == sorted(ours + others)
        index.delete_many([ours[1].supercuboid(0), ours[1].supercuboid(9)])
        assert index.volumes("1&2&3&") == [ours[0], *ours[2:]]

    def test_a_sound_index_is_ready_again_as_it_was(self, index: SupercuboidIndex) -> None:
        v = VolumeKey(1, 1, 1, 0, 0)
        index.put_many([v.supercuboid(3)])
        assert index.ensure_ready() is None
        assert index.ensure_ready(thorough=True) is None  # nothing to set aside
        assert index.mortons(v) == [3]

    def test_nothing_asked_is_nothing_done(self, index: SupercuboidIndex) -> None:
        index.put_many([])
        index.delete_many([])
        assert index.volumes("") == []

    def test_a_volume_emptied_is_no_longer_listed(self, index: SupercuboidIndex) -> None:
        v, w = VolumeKey(2, 2, 2, 0, 0), VolumeKey(2, 2, 2, 1, 0)
        index.put_many([v.supercuboid(1), v.supercuboid(2), w.supercuboid(1)])
        index.delete_many([v.supercuboid(1), v.supercuboid(2)])
        assert index.mortons(v) == []
        assert index.volumes("2&2&2&") == [w]
        index.put_many([v.supercuboid(2)])  # back again
        assert index.volumes("2&2&2&") == [v, w]
        assert index.mortons(v) == [2]

    def test_the_largest_morton_codes_keep_their_order(self, index: SupercuboidIndex) -> None:
        """Morton codes of 63 bits (a 2^21 grid in each of three axes) sort as numbers, not text."""
        v = VolumeKey(3, 3, 3, 0, 0)
        mortons = [2**63 - 1, 2**62, 10, 2**40 + 1, 1]
        index.put_many([v.supercuboid(m) for m in mortons])
        assert index.mortons(v) == sorted(mortons)
