"""In-memory implementations of the ObjectStore, SupercuboidIndex, LabelIndex and SharedMetrics ports: what an
engine test passes in when it tests the engine, not a backend (no directory, no SQLite file, no
server). Each is a few dicts under a lock, safe for the engine's threads, gone with the object;
each passes its port's contract suite (tests/contracts/).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence

from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.core.observe import BUCKETS
from ndstore.storage.interfaces import Histogram, Snapshot


class MemoryObjectStore:
    """A dict of key -> bytes."""

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def ensure_ready(self) -> None:
        pass

    def get_many(self, keys: Sequence[str], window: int | None = None) -> Iterator[tuple[str, bytes | None]]:
        """Each key as the caller takes it (so never more than one fetched ahead, whatever ``window``)."""
        for key in list(keys):
            with self._lock:
                data = self._objects.get(key)
            yield key, data

    def put_many(self, items: Mapping[str, bytes]) -> None:
        copied = {key: bytes(data) for key, data in items.items()}  # a caller's buffer may change later
        with self._lock:
            self._objects.update(copied)

    def delete_many(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._objects.pop(key, None)

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            found = [key for key in self._objects if key.startswith(prefix)]
        yield from found


class MemorySupercuboidIndex:
    """Volume partition -> the set of its Morton codes."""

    def __init__(self) -> None:
        self._volumes: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def ensure_ready(self, thorough: bool = False) -> str | None:
        return None  # nothing of it can be damaged

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None:
        with self._lock:
            for key in keys:
                self._volumes.setdefault(key.volume.partition, set()).add(key.morton)

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None:
        with self._lock:
            for key in keys:
                mortons = self._volumes.get(key.volume.partition)
                if mortons is not None:
                    mortons.discard(key.morton)
                    if not mortons:
                        del self._volumes[key.volume.partition]

    def mortons(self, volume: VolumeKey) -> list[int]:
        with self._lock:
            return sorted(self._volumes.get(volume.partition, ()))

    def volumes(self, prefix: str) -> list[VolumeKey]:
        with self._lock:
            partitions = [p for p in self._volumes if p.startswith(prefix)]
        return sorted(VolumeKey.parse_partition(p) for p in partitions)


class MemoryLabelIndex:
    """Supercuboid -> {label: count}, supercuboid -> why unsettled, channel prefix -> complete."""

    def __init__(self) -> None:
        self._labels: dict[SupercuboidKey, dict[int, int]] = {}
        self._unsettled: dict[SupercuboidKey, str] = {}
        self._channels: dict[str, bool] = {}
        self._lock = threading.Lock()

    def ensure_ready(self, thorough: bool = False) -> str | None:
        return None  # nothing of it can be damaged

    def register(self, prefixes: Sequence[str], complete: bool) -> list[str]:
        with self._lock:
            new = [p for p in dict.fromkeys(prefixes) if p not in self._channels]
            self._channels.update(dict.fromkeys(new, complete))
        return new

    def set_complete(self, prefixes: Sequence[str]) -> None:
        with self._lock:
            self._channels.update({p: True for p in prefixes if p in self._channels})

    def channel(self, prefix: str) -> bool | None:
        with self._lock:
            return self._channels.get(prefix)

    def begin(self, counts: Mapping[SupercuboidKey, Mapping[int, int]], why: str) -> None:
        with self._lock:
            for key, found in counts.items():
                self._unsettled[key] = why
                self._labels.setdefault(key, {}).update(found)

    def settle(self, drops: Mapping[SupercuboidKey, Collection[int]], unmark: bool = True) -> None:
        with self._lock:
            for key, labels in drops.items():
                held = self._labels.get(key, {})
                for label in labels:
                    held.pop(label, None)
                if not held:
                    self._labels.pop(key, None)
                if unmark:
                    self._unsettled.pop(key, None)

    def labels_of(self, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, dict[int, int]]:
        with self._lock:
            return {key: dict(self._labels.get(key, {})) for key in keys}

    def supercuboids_of(self, volume: VolumeKey, label: int) -> dict[int, int]:
        with self._lock:
            return {key.morton: held[label] for key, held in self._labels.items()
                    if key.volume == volume and label in held}

    def unsettled(self, volume: VolumeKey) -> dict[int, str]:
        with self._lock:
            return {key.morton: why for key, why in self._unsettled.items() if key.volume == volume}

    def indexed(self, prefix: str) -> list[SupercuboidKey]:
        with self._lock:
            return sorted(key for key in {*self._labels, *self._unsettled} if key.name.startswith(prefix))


class MetricsTable:
    """The table recorders add into: one per "deployment" (RedisMetrics: one Redis hash)."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.lock = threading.Lock()


class MemoryMetrics:
    """A SharedMetrics recorder adding into a MetricsTable (its own, or one shared with other
    recorders, as processes share the Redis hash); its counts are in the table at once."""

    def __init__(self, table: MetricsTable | None = None) -> None:
        self.table = table or MetricsTable()

    def count(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, Snapshot.labels_key(labels))
        with self.table.lock:
            counters = self.table.snapshot.counters
            counters[key] = counters.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        bucket = next((i for i, le in enumerate(BUCKETS) if value <= le), len(BUCKETS))
        with self.table.lock:
            histogram = self.table.snapshot.histograms.setdefault((name, Snapshot.labels_key(labels)), Histogram())
            histogram.buckets[bucket] += 1
            histogram.sum += value

    def flush(self) -> bool:
        return True

    def close(self) -> bool:
        return True

    def snapshot(self) -> Snapshot:
        with self.table.lock:
            now = self.table.snapshot
            return Snapshot(dict(now.counters),
                            {k: Histogram(list(h.buckets), h.sum) for k, h in now.histograms.items()})

    def reset(self) -> None:
        with self.table.lock:
            self.table.snapshot = Snapshot()
