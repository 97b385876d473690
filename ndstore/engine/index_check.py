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
- `GuardedIndex.ensure_ready` (every process's start, /healthz): an index whose own storage is
  damaged (a SQLite file overwritten or truncated) is moved aside by its adapter, kept, and an
  empty one begun; it is marked stale, and the process says so in one log line.
- `GuardedIndex`: the index the service uses; listing a volume's supercuboids while the mark is
  there raises IndexStale (503 naming the fix).
- `reindex` (`ndstore reindex`): the index checked in full (a damaged one set aside), an entry for
  every stored supercuboid, then the mark removed. Entries without an object are left: harmless
  (a missing object reads as zeros), as designed.
"""

from __future__ import annotations

import itertools
import json
import logging
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
REFUSED = ("bounding boxes, downsampling and channel deletes answer 503 (IndexStale) until an operator runs "
           "`ndstore reindex`")
log = logging.getLogger(__name__)


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
        mark_stale(objects, f"{len(missing)} of {len(keys)} sampled stored supercuboids have no index entry (the "
                            "index was lost or is older than the objects)",
                   sampled=len(keys), missing=len(missing), examples=[k.object_key for k in missing[:5]])
    return IndexCheck(len(keys), missing)


def mark_stale(objects: ObjectStore, why: str, **details: object) -> None:
    objects.put_many({STALE_KEY: json.dumps({"at": time.time(), "why": why, **details}).encode()})


def stale_mark(objects: ObjectStore) -> dict[str, object] | None:
    [(_, raw)] = list(objects.get_many([STALE_KEY]))
    return None if raw is None else dict(json.loads(raw))


def stale_reason(mark: dict[str, object]) -> str:
    """What a stale mark says was found (a mark of an older release has no `why`)."""
    return str(mark.get("why") or f"{mark.get('missing')} of {mark.get('sampled')} sampled stored supercuboids "
                                  "have no index entry")


def reindex(objects: ObjectStore, index: SupercuboidIndex) -> int:
    """The index checked in full (a damaged one set aside: ensure_ready), an entry for every
    stored supercuboid, then the stale mark removed. Returns how many entries."""
    index.ensure_ready(thorough=True)
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
        self.set_aside: str | None = None  # what this process found damaged and set aside, if anything

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """The index ready; a damaged one set aside by its adapter is marked stale here, and said
        in one line naming the file, what is wrong and the command that repairs it."""
        found = self.index.ensure_ready(thorough)
        if found is not None:
            mark_stale(self.objects, found)
            log.warning("INDEX STALE: %s; %s", found, REFUSED)
            self.set_aside = found
        return found

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        self.index.put_many(keys)

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        self.index.delete_many(keys)

    def require_fresh(self) -> None:
        """Raise IndexStale while the index is marked stale (before a bulk operation starts)."""
        mark = stale_mark(self.objects)
        if mark is not None:
            raise IndexStale(f"the supercuboid index is marked stale ({stale_reason(mark)}): listing stored "
                             "supercuboids would answer wrong; an operator must run `ndstore reindex`")

    def mortons(self, volume: VolumeKey) -> list[int]:
        self.require_fresh()
        return self.index.mortons(volume)

    def volumes(self, prefix: str) -> list[VolumeKey]:
        self.require_fresh()
        return self.index.volumes(prefix)
