"""The ObjectStore port's contract: a flat key -> bytes store (the base tier).

A subclass defines the fixture `store`: an empty store of the implementation under test, made
ready (`ensure_ready`). Keys are flat names as the base tier writes them (a supercuboid's
`object_key`: a hash, `&`, its volume and Morton code), never paths.
"""

from __future__ import annotations

import pytest

from ndstore.core.keys import VolumeKey
from ndstore.storage.interfaces import ObjectStore


class ObjectStoreContract:
    @pytest.fixture
    def store(self) -> ObjectStore:
        raise NotImplementedError("a subclass defines the `store` fixture: an empty, ready store")

    def test_put_get_overwrite_delete(self, store: ObjectStore) -> None:
        items = {f"k{i}&x": bytes([i]) * (1000 * i + 1) for i in range(20)}
        store.put_many(items)
        assert dict(store.get_many(list(items))) == items
        store.put_many({"k3&x": b"new"})
        assert dict(store.get_many(["k3&x"])) == {"k3&x": b"new"}
        store.delete_many(["k3&x", "k4&x", "never-stored"])
        got = dict(store.get_many(["k3&x", "k4&x", "k5&x"]))
        assert got == {"k3&x": None, "k4&x": None, "k5&x": items["k5&x"]}

    def test_missing_keys_read_as_none(self, store: ObjectStore) -> None:
        assert dict(store.get_many(["nothing-here"])) == {"nothing-here": None}

    def test_large_object_round_trip(self, store: ObjectStore) -> None:
        blob = bytes(range(256)) * (17 * 4096 + 3)
        store.put_many({"big": blob})
        assert dict(store.get_many(["big"]))["big"] == blob

    def test_an_empty_object_is_stored_not_missing(self, store: ObjectStore) -> None:
        store.put_many({"empty": b""})
        assert dict(store.get_many(["empty"])) == {"empty": b""}
        assert list(store.list_keys("empty")) == ["empty"]

    def test_nothing_asked_is_nothing_done(self, store: ObjectStore) -> None:
        store.put_many({})
        store.delete_many([])
        assert list(store.get_many([])) == []
        assert list(store.get_many([], window=4)) == []
        assert list(store.list_keys()) == []

    def test_ensure_ready_again_keeps_what_is_stored(self, store: ObjectStore) -> None:
        store.put_many({"kept": b"still here"})
        store.ensure_ready()
        assert dict(store.get_many(["kept"])) == {"kept": b"still here"}

    def test_a_window_yields_every_key_once_as_the_caller_takes_them(self, store: ObjectStore) -> None:
        items = {f"w{i:02}&x": f"object {i}".encode() * (i + 1) for i in range(30)}
        store.put_many(items)
        keys = [*items, "w-missing"]
        taken: dict[str, bytes | None] = {}
        for key, data in store.get_many(keys, window=3):
            assert key not in taken
            taken[key] = data
        assert taken == {**items, "w-missing": None}

    def test_list_keys_finds_every_key_by_prefix(self, store: ObjectStore) -> None:
        volume = VolumeKey(1, 2, 3, 0, 0)
        keys = [volume.supercuboid(m).object_key for m in range(12)]
        store.put_many(dict.fromkeys(keys, b"sc"))
        store.put_many({keys[0]: b"again"})  # an overwrite is still one key
        assert sorted(store.list_keys()) == sorted(keys)
        first = keys[0][:2]
        assert sorted(store.list_keys(first)) == sorted(k for k in keys if k.startswith(first))
        assert sorted(store.list_keys(keys[5])) == [keys[5]]
        assert list(store.list_keys("no-such-prefix")) == []
        store.delete_many(keys[:6])
        assert sorted(store.list_keys()) == sorted(keys[6:])
