"""The supercuboid index checked against the object store, and rebuilt from it.

Object keys are self-describing (ndstore/core/keys.py): every stored supercuboid names its
volume and Morton code, so the index can always be rebuilt by listing the store. The index is
kept a superset of the objects (base_tier.py); an object with no index entry means the index was
lost or restored from an older copy. Reads never use the index, but everything that lists the
stored supercuboids of a volume does: a channel's bounding box, a downsample build (it would
build empty levels), deleting a channel (it would leave private data behind). So:

- `check` (at every start, `ndstore_prepare`): a sample of the store's keys looked up in the
  index; one missing and the index is marked stale (an object `_ndstore-index-stale` next to the
  supercuboids, so every process and every restart sees it).
- `GuardedIndex`: the index the service uses; listing a volume's supercuboids while the mark is
  there raises IndexStale (503 naming the fix).
- `reindex` (`ndstore reindex`): an entry for every stored supercuboid, then the mark removed.
  Entries without an object are left: harmless (a missing object reads as zeros), as designed.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ndstore.core.errors import IndexStale
from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.storage.interfaces import ObjectStore, SupercuboidIndex

STALE_KEY = "_ndstore-index-stale"
SAMPLE = 256
BATCH = 1000


def stored_supercuboids(objects: ObjectStore) -> Iterator[SupercuboidKey]:
    """The supercuboid keys in the object store (the ledgers and marks beside them left out)."""
    for object_key in objects.list_keys():
        try:
            yield SupercuboidKey.parse(object_key)
        except ValueError:
            continue


def stored_with_prefix(objects: ObjectStore, prefix: str) -> Iterator[SupercuboidKey]:
    """The stored supercuboids whose names start with ``prefix`` (a channel's `name_prefix`). The
    hash that leads every object key scatters a channel over the whole key space, so this lists
    the whole store, as `reindex` does: a bulk operation's cost."""
    return (key for key in stored_supercuboids(objects) if key.name.startswith(prefix))


@dataclass(frozen=True)
class IndexCheck:
    sampled: int
    missing: list[SupercuboidKey]

    @property
    def stale(self) -> bool:
        return bool(self.missing)


def check(objects: ObjectStore, index: SupercuboidIndex, sample: int = SAMPLE) -> IndexCheck:
    """Look up a sample of the stored supercuboids in the index; mark it stale if one is missing."""
    keys = list(itertools.islice(stored_supercuboids(objects), sample))
    by_volume: dict[VolumeKey, list[SupercuboidKey]] = defaultdict(list)
    for key in keys:
        by_volume[key.volume].append(key)
    missing: list[SupercuboidKey] = []
    for volume, stored in by_volume.items():
        indexed = set(index.mortons(volume))
        missing.extend(k for k in stored if k.morton not in indexed)
    if missing:
        mark = {"at": time.time(), "sampled": len(keys), "missing": len(missing),
                "examples": [k.object_key for k in missing[:5]]}
        objects.put_many({STALE_KEY: json.dumps(mark).encode()})
    return IndexCheck(len(keys), missing)


def stale_mark(objects: ObjectStore) -> dict[str, object] | None:
    [(_, raw)] = list(objects.get_many([STALE_KEY]))
    return None if raw is None else dict(json.loads(raw))


def reindex(objects: ObjectStore, index: SupercuboidIndex) -> int:
    """An index entry for every stored supercuboid, then the stale mark removed. Returns how many."""
    count = 0
    keys = stored_supercuboids(objects)
    while batch := list(itertools.islice(keys, BATCH)):
        index.put_many(batch)
        count += len(batch)
    objects.delete_many([STALE_KEY])
    return count


class GuardedIndex:
    """The supercuboid index, refusing to list a volume while it is marked stale."""

    def __init__(self, index: SupercuboidIndex, objects: ObjectStore):
        self.index = index
        self.objects = objects

    def ensure_ready(self) -> None:
        self.index.ensure_ready()

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        self.index.put_many(keys)

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        self.index.delete_many(keys)

    def require_fresh(self) -> None:
        """Raise IndexStale while the index is marked stale (before a bulk operation starts)."""
        mark = stale_mark(self.objects)
        if mark is not None:
            raise IndexStale(f"the supercuboid index misses objects the object store holds ({mark['missing']} of "
                             f"{mark['sampled']} sampled at start): listing stored supercuboids would answer wrong; an "
                             "operator must run `ndstore reindex`")

    def mortons(self, volume: VolumeKey) -> list[int]:
        self.require_fresh()
        return self.index.mortons(volume)

    def volumes(self, prefix: str) -> list[VolumeKey]:
        self.require_fresh()
        return self.index.volumes(prefix)
