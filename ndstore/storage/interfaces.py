"""The ports: every storage protocol the engine and NDBlaze depend on, with the values they pass.

The engine and blaze import this module only (an import-linter contract): adapters are chosen
and built in one place, ndstore.wiring. Each port has a contract test suite (ndstore.testing) that
runs against every implementation (tests/contracts/).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ndstore.core.keys import SupercuboidKey, VolumeKey
from ndstore.core.observe import BUCKETS, Observer

# -- the base tier ----------------------------------------------------------------------------


class ObjectStore(Protocol):
    """A flat key -> bytes store: the base tier (S3 or a local directory)."""

    def ensure_ready(self) -> None:
        """Create the bucket/directory if it is missing."""

    def get_many(self, keys: Sequence[str], window: int | None = None) -> Iterator[tuple[str, bytes | None]]:
        """Fetch keys in parallel; yield (key, bytes) as each arrives, None for a missing key.
        With a ``window``, at most that many objects are fetched and not yet taken by the caller."""

    def put_many(self, items: Mapping[str, bytes]) -> None: ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete keys; missing keys are not an error."""

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Every key starting with ``prefix``, in no particular order."""


class SupercuboidIndex(Protocol):
    """Which supercuboids are stored: one entry per object, by volume and Morton code."""

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """Create the table or file if it is missing. An index whose own storage cannot be read
        (a SQLite file overwritten or truncated; with ``thorough``, any damaged page) is moved
        aside, kept, and an empty one begun: returns what was found and where it was kept, for
        the caller to mark the index stale; None when it was sound."""

    def put_many(self, keys: Sequence[SupercuboidKey]) -> None: ...

    def delete_many(self, keys: Sequence[SupercuboidKey]) -> None: ...

    def mortons(self, volume: VolumeKey) -> list[int]:
        """Morton codes of the stored supercuboids of one volume, ascending."""

    def volumes(self, prefix: str) -> list[VolumeKey]:
        """Every volume with an entry whose partition starts with ``prefix`` (a channel's
        `name_prefix`: its levels and time samples, whether its experiment declares them now or
        not), in order. Bulk operations only: on DynamoDB it scans the table."""


class LabelIndex(Protocol):
    """Which labels (uint64, 0 never) each stored supercuboid of a label channel holds, with a
    voxel count for each, found both ways: the supercuboids of a label in a volume, the labels
    of a supercuboid. A supercuboid being rewritten, or holding too many labels to record, is
    marked unsettled (with why): its voxels, not its entries, say what it holds. The channels it
    serves are registered, each complete or not yet (docs/design/label-index.md)."""

    def ensure_ready(self, thorough: bool = False) -> str | None:
        """Create the table or file if it is missing; as SupercuboidIndex.ensure_ready, a damaged
        SQLite file is set aside (returns what was found), an empty index begun."""

    def register(self, prefixes: Sequence[str], complete: bool) -> list[str]:
        """Serve these channels (`ChannelVolume.name_prefix`) from now on; those not registered
        before are recorded ``complete`` or not. Returns those newly recorded."""

    def set_complete(self, prefixes: Sequence[str]) -> None:
        """Every stored supercuboid of these registered channels is indexed now."""

    def channel(self, prefix: str) -> bool | None:
        """Whether a channel's index is complete; None when it is not registered."""

    def begin(self, counts: Mapping[SupercuboidKey, Mapping[int, int]], why: str) -> None:
        """Mark each supercuboid unsettled (``why``), then record the counts given: labels it
        gains and labels whose count changes. Its other entries are kept."""

    def settle(self, drops: Mapping[SupercuboidKey, Collection[int]], unmark: bool = True) -> None:
        """Remove the labels given from each supercuboid, then (``unmark``) its mark."""

    def labels_of(self, keys: Sequence[SupercuboidKey]) -> dict[SupercuboidKey, dict[int, int]]:
        """label -> voxel count of each supercuboid ({} when it has no entry)."""

    def supercuboids_of(self, volume: VolumeKey, label: int) -> dict[int, int]:
        """Morton code -> voxel count of each supercuboid of ``volume`` recorded with ``label``."""

    def unsettled(self, volume: VolumeKey) -> dict[int, str]:
        """Morton code -> why, of each supercuboid of ``volume`` marked unsettled."""

    def indexed(self, prefix: str) -> list[SupercuboidKey]:
        """Every supercuboid with an entry or a mark whose name starts with ``prefix``, sorted.
        Bulk operations only (a rebuild): on DynamoDB it scans the table."""


# -- locks and the cache tier -----------------------------------------------------------------


class ExclusiveLocks(Protocol):
    """Named exclusive locks with a lease, shared by every process that writes the base tier."""

    def hold(self, names: Sequence[str]) -> AbstractContextManager[None]:
        """Hold every lock in ``names`` for the duration of the ``with`` block.
        Raises LockTimeout if they cannot all be taken in time."""


class RWLocks(ExclusiveLocks, Protocol):
    """Named readers-writer locks; `hold` is the write (exclusive) mode."""

    def read(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]: ...

    def write(self, names: Sequence[str], timeout_s: float | None = None) -> AbstractContextManager[None]: ...

    def mixed(self, reads: Sequence[str] = (), writes: Sequence[str] = (),
              timeout_s: float | None = None) -> AbstractContextManager[None]:
        """Read locks on some names and write locks on others, held together."""


@dataclass(frozen=True)
class Held:
    """A Redis's own account of the writes it holds that the base tier does not have yet, read
    in one atomic step (see ndstore/engine/ledger.py)."""

    epoch: str | None  # the mark of its run, set once its holdings were checked; None: never checked
    seq: int  # writes numbered so far
    unflushed: dict[str, int]  # supercuboid name -> seq of its newest write not yet in the base tier


class Holdings(Protocol):
    """What a Redis that holds acknowledged writes says about them."""

    def held(self) -> Held: ...

    def start_epoch(self, epoch: str, seq: int) -> None:
        """Mark the holdings checked under ``epoch``; the next write is numbered past ``seq``."""

    def clear_epoch(self) -> None:
        """Remove the mark: writes are refused (RedisUnverified) until it is set again."""


# The cuboid cache, cut into ports by what each caller needs. One adapter may implement them all
# (RedisCuboidCache does); a caller holds the supercuboid's lock, and the cache only stores.


class CuboidStore(Protocol):
    """The request path's cuboid blobs of resident supercuboids, by supercuboid name and cuboid
    number (-1: the supercuboid's metadata). Every blob is checked against its digest when read:
    a damaged one raises DamagedInCache, never comes back."""

    def get_many(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None]]:
        """The given cuboids of each supercuboid (None where a cuboid has no blob), in one step."""

    def get_if_resident(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None] | None]:
        """`get_many`, None for each supercuboid that is not resident, in one step."""

    def get_all(self, name: str, count: int) -> list[bytes | None]:
        """Cuboids 0 to ``count`` - 1 of one supercuboid."""

    def put(self, name: str, blobs: Mapping[int, bytes | memoryview], now: float, dirty: bool) -> None:
        """Store cuboid blobs and mark the supercuboid resident (accessed ``now``) and, if
        ``dirty``, dirty with a fresh seq (`Holdings`): all or nothing. Refused (RedisUnverified)
        while the holdings are not checked (no epoch)."""

    def touch(self, names: Sequence[str], now: float) -> None:
        """Access times for the LRU order; names not resident are left out."""


class Residency(Protocol):
    """Copies from the base tier: whole supercuboids paged in, and cuboids a resident one lacks."""

    def resident(self, names: Sequence[str]) -> list[bool]: ...

    def page_in(self, name: str, blobs: Mapping[int, bytes | memoryview], now: float, run: str) -> None:
        """Clean cuboids copied from the base tier, the supercuboid then resident; the store may
        forget them in a restart (they are not logged): see `absent` and `fill`. Refused
        (RedisUnverified) unless the store is still in ``run``, the mark `loss_marks` gave
        before the copy was fetched."""

    def fill(self, name: str, blobs: Mapping[int, bytes | memoryview], run: str) -> None:
        """Clean cuboids a resident supercuboid lacks, copied from the base tier, as `page_in`
        stores them; a cuboid stored since it was found absent is kept."""

    def absent(self, name: str, numbers: Sequence[int]) -> list[int]:
        """Which of ``numbers`` the supercuboid holds no blob for."""


class DirtySet(Protocol):
    """What the write-back owes the base tier: dirty supercuboids, since when."""

    def dirty_before(self, when: float, limit: int) -> list[str]:
        """Up to ``limit`` supercuboids dirty since ``when`` or earlier, longest-dirty first."""

    def oldest_dirty(self) -> float | None:
        """When the longest-dirty supercuboid became dirty (None: nothing is dirty)."""

    def is_dirty(self, names: Sequence[str]) -> list[bool]: ...

    def clear_dirty(self, name: str) -> None:
        """Written back: no longer dirty, and no longer in the holdings' account."""


class Occupancy(Protocol):
    """What the cache holds and how much: eviction, bulk operations, gauges."""

    def evict(self, name: str) -> None:
        """Drop a supercuboid whole: its cuboids, residency, dirty mark and seq."""

    def coldest(self, count: int) -> list[str]:
        """The least recently used resident supercuboids, coldest first."""

    def used_memory(self) -> int:
        """Bytes the store uses (on a Cluster, its fullest node's)."""

    def count(self) -> tuple[int, int]:
        """(resident, dirty) supercuboid counts."""

    def names_with_prefix(self, prefix: str) -> list[str]:
        """Resident or dirty supercuboids whose names start with ``prefix`` (bulk operations only)."""


class LossMarks(Holdings, Protocol):
    """The checked mark of the store's run, and the supercuboids refused as lost (ndstore/engine/ledger.py)."""

    def loss_marks(self, names: Sequence[str]) -> tuple[str | None, dict[str, str], str | None]:
        """(the epoch mark of this checked run, None when there is none; why each of ``names``
        that is marked lost was lost; the NDBlaze run the record of NDBlaze writes describes when
        one of ``names`` is in it, "" when there is no record, None otherwise), one round trip."""

    def mark_lost(self, reasons: Mapping[str, str]) -> None: ...

    def lost(self) -> dict[str, str]:
        """Every supercuboid marked lost, with why."""

    def forget_lost(self, names: Sequence[str]) -> None: ...


class BufferedRecord(Protocol):
    """The record of NDBlaze writes, kept in the cache's store (ndstore/engine/ledger.py, "the record")."""

    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool:
        """Record each supercuboid's newest NDBlaze write (its seq), taken in the buffer's ``run``;
        False (nothing recorded) when the record describes another run or none."""

    def forget_buffered(self, seqs: Mapping[str, int]) -> None:
        """Merged up to these seqs: each name recorded no later is dropped."""

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        """The record brought to what the buffer holds in ``run`` (its counter ``seq``, its
        names' newest seqs); started afresh when it described another run."""

    def buffered(self) -> tuple[str | None, dict[str, int]]:
        """(the run the record describes, None without a record; name -> recorded seq)."""

    def drop_buffered(self) -> None:
        """Drop the record (it may be as short as this store): rebuilt from the buffer."""


class LockFreeCommits(Protocol):
    """Small reads and writes that take no lock: what a cache offers when it can see, in the same
    atomic step as its own, whether anyone holds a supercuboid's readers-writer lock (the Redis
    cache beside RedisRWLocks in the same Redis). Each declines (None, False: nothing happened)
    whenever it would not be safe; the caller then takes the locks."""

    def read_unlocked(self, wanted: Mapping[str, Sequence[int]], now: float) -> dict[str, list[bytes | None]] | None:
        """The given cuboids of each supercuboid as one atomic snapshot, accessed ``now``; None
        unless the store is checked, and each supercuboid is resident, not marked lost, without
        an NDBlaze write recorded, and no writer holds its lock."""

    def read_for_update(self, wanted: Mapping[str, Sequence[int]],
                        now: float) -> dict[str, tuple[list[bytes | None], list[bytes | None]]] | None:
        """`read_unlocked`, with each blob's stored digest: what `commit_unlocked` checks."""

    def commit_unlocked(self, blobs: Mapping[str, Mapping[int, bytes]], expected: Mapping[str, Mapping[int, bytes]],
                        now: float) -> bool:
        """Store each supercuboid's new cuboid blobs and mark it dirty, all of them or none, only
        if the store is checked, each is resident, not lost, without an NDBlaze write recorded,
        no one (reader or writer) holds its lock, and the cuboids in ``expected`` still have the
        digests `read_for_update` gave. False: nothing was stored."""


class CuboidCache(CuboidStore, Residency, DirtySet, Occupancy, LossMarks, BufferedRecord, Protocol):
    """The whole cache adapter: every port above, and lock-free commits where it can offer them."""

    @property
    def lock_free(self) -> LockFreeCommits | None:
        """Its lock-free reads and commits; None when it cannot see the locks (every request
        then takes them)."""


# -- work queues (ingest and downsample tasks) ------------------------------------------------


@dataclass(frozen=True)
class Message:
    body: str
    receipt: str  # deletes this delivery of the message; another delivery has another receipt
    receive_count: int  # deliveries so far, this one included
    queue_url: str

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class QueueCounts:
    waiting: int  # visible: the next receive may get them
    in_flight: int  # received, neither deleted nor visible again yet

    @property
    def total(self) -> int:
        return self.waiting + self.in_flight


class WorkQueue(Protocol):
    """Named queues of text tasks, each with a dead-letter queue `<name>-dlq`: at least once
    delivery; a received message is hidden for its visibility timeout, then delivered again
    unless deleted; a message received `max_receives` times goes to the dead-letter queue
    instead of being delivered once more. SQS semantics; a queue is named by its URL."""

    def create(self, name: str, visibility_s: int, max_receives: int) -> str:
        """Create (or find) queue `name` and its dead-letter queue; returns its URL."""

    def url(self, name: str) -> str | None:
        """The queue's URL, None when it does not exist."""

    def names(self, prefix: str) -> list[str]:
        """Names of the existing queues that start with `prefix` (dead-letter queues included)."""

    def arn(self, url: str) -> str:
        """The queue's identifier for other services (bucket notifications, triggers)."""

    def delete(self, name: str) -> None:
        """Delete the queue and its dead-letter queue, with their messages; idempotent."""

    def send(self, url: str, bodies: Iterable[str]) -> int:
        """Send every body (StorageError if any is refused); returns the count."""

    def receive(self, url: str, max_messages: int = 10, wait_s: int = 1,
                visibility_s: int | None = None) -> list[Message]:
        """Up to `max_messages` (at most 10) visible messages, waiting up to `wait_s` for one."""

    def delete_message(self, url: str, receipt: str) -> None:
        """Delete a received message; a receipt that no longer names one is not an error."""

    def retry_later(self, message: Message, delay_s: int = 0) -> None:
        """Make a received message visible again after `delay_s`."""

    def counts(self, url: str) -> QueueCounts: ...

    def peek(self, url: str, limit: int = 100) -> list[Message]:
        """Up to `limit` messages, looked at and made visible again (counts as a receive)."""

    def move_all(self, source_url: str, target_url: str) -> int:
        """Move every message of one queue to another (a crash may duplicate one, never lose it)."""


# -- the tile store, the job state and the triggers of the ingest pipeline ----------------------


@dataclass(frozen=True)
class UploadTarget:
    """Where and how an uploader PUTs one tile: the URL and the headers it must send (signed
    into the URL: the store refuses the PUT with any other key, headers, length, or after it
    expires)."""

    url: str
    headers: dict[str, str]


@dataclass(frozen=True)
class TileHead:
    """What the store says of a tile without reading it."""

    metadata: dict[str, str]
    size: int  # bytes
    stored_at: float  # unix seconds the store took it (S3: Last-Modified, to the second)


class TileStore(Protocol):
    """The ingest's uploaded tiles, with their metadata, and a notification of each new tile."""

    def ensure_ready(self, notify_queue_arn: str | None = None) -> None:
        """Create the store if missing; with a queue's ARN, each new tile is announced there as
        an S3 ObjectCreated event (what the tile-uploaded handler takes)."""

    def upload_target(self, key: str, metadata: dict[str, str], expires_s: int, size: int) -> UploadTarget:
        """A PUT of exactly `size` bytes to `key` whose metadata must be exactly `metadata`, for
        an uploader with no credentials of its own, until `expires_s` seconds from now."""

    def put(self, key: str, body: bytes, metadata: dict[str, str]) -> None: ...

    def head(self, key: str) -> TileHead | None:
        """The tile's metadata, size and time stored, or None when it is not (or no longer) there."""

    def metadata(self, key: str) -> dict[str, str] | None:
        """The tile's metadata, or None when it is not (or no longer) there."""

    def get_many_with_metadata(self, keys: Sequence[str], max_bytes: int
                               ) -> Iterator[tuple[str, tuple[bytes, dict[str, str]] | None]]:
        """(key, (bytes, metadata)) of each tile as it arrives, None where it is missing; at most
        a few read ahead of the caller, so the tiles are never all held at once. A tile over
        `max_bytes` is PayloadTooLarge, raised from its size before its bytes are read."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete tiles; missing ones are not an error."""


class JobState(Protocol):
    """Rows of progress of ingest jobs and downsample runs, by key: counters, a job's sealed
    spec, and per-unit rows (a supercuboid of an ingest job, a parent of a run) with a set of
    arrived tile ordinals, a claim and flags. Every change a counter follows is conditional, so
    a duplicate event or a retried handler never counts twice (docs/design/ingest.md)."""

    def ensure_ready(self) -> None: ...

    def record_tile(self, job: str, row: str, ordinal: int, expected: int) -> bool:
        """Add a tile to its row and count it on the job; False when it was there already or
        the row was cleaned (a late duplicate)."""

    def supercuboid(self, row: str) -> dict[str, Any]:
        """The row as plain values: tiles (set of ordinals), expected, claim, queued, built, cleaned."""

    def has_tile(self, row: str, ordinal: int) -> bool: ...

    def claim(self, row: str, claimant: str) -> bool:
        """Take the row for `claimant`; True if it was free or already theirs."""

    def mark(self, row: str, flag: str) -> None: ...

    def mark_counted(self, job: str, row: str, flag: str, counter: str, drop_tiles: bool = False) -> bool:
        """Set a flag once and count it on the job; False when it was set before."""

    def set_count(self, key: str, name: str, value: int) -> None: ...

    def counters(self, key: str) -> dict[str, int]:
        """Every number of a row."""

    def job(self, job: str) -> dict[str, int]:
        """A job's counters: tiles_uploaded, supercuboids_built, supercuboids_cleaned, manifest_sent (0 if unset)."""

    def put_job(self, job: str, spec: str) -> None: ...

    def job_spec(self, job: str) -> str | None: ...

    def advance_manifest(self, job: str, sent: int, to: int) -> bool:
        """Set manifest_sent to `to` if it is `sent` (or unset when `sent` is 0)."""

    def open_leave(self, job: str, uploader: str) -> str | None:
        """The uploader's leave on the job (a random token, made on the first call and kept
        until revoked); None once the job is stopped. `uploader`: `[A-Za-z0-9_-]{1,64}`."""

    def leaves(self, job: str) -> dict[str, str] | None:
        """Uploader -> leave of every uploader whose leave stands; None once the job is stopped
        (or when it has no spec: never recorded, or removed)."""

    def revoke_leave(self, job: str, uploader: str) -> None:
        """The uploader's leave stands no more (a later open_leave makes another)."""

    def stop(self, job: str) -> None:
        """The job takes nothing more: leaves() is None from now on, open_leave refuses."""

    def delete(self, keys: Sequence[str]) -> None: ...


class Triggers(Protocol):
    """Functions run by a queue's messages (AWS Lambda event source mappings)."""

    def attach(self, queue_arn: str, function: str, batch_size: int = 10) -> None:
        """Trigger `function` with the queue's messages; idempotent."""

    def detach(self, queue_arn: str) -> None: ...


# -- the NDBlaze write buffer -----------------------------------------------------------------


@dataclass(frozen=True)
class PendingBlob:
    seq: int
    header: bytes
    body: bytes


@dataclass(frozen=True)
class BufferStats:
    pending_bytes: int
    blobs: int
    supercuboids: int
    oldest_age_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BlazeBuffer(Holdings, Protocol):
    """Pending NDBlaze writes, stored as they arrived, indexed by every supercuboid they touch,
    in one total order (the sequence number)."""

    def drop_all_but(self, keep: frozenset[str]) -> int:
        """Release every pending blob of every supercuboid not in ``keep``; returns how many."""

    def append(self, header: bytes, body: bytes, names: Sequence[str]) -> int:
        """Store one body under every supercuboid name; returns its sequence number. Raises
        BufferFull past the limit (nothing stored), StorageError when the buffer is away."""

    def append_in_run(self, header: bytes, body: bytes, names: Sequence[str]) -> tuple[int, str]:
        """`append`, with the mark of the checked run that took it (one step)."""

    def mark(self) -> str | None:
        """The mark of its checked run; None when there is none (it restarted empty, unchecked)."""

    def pending_seqs(self, names: Sequence[str]) -> dict[str, list[int]]:
        """The pending seqs of each name, ascending, as one atomic snapshot."""

    def blobs(self, seqs: Sequence[int]) -> list[PendingBlob]:
        """The blobs of `seqs` in seq order; one merged and deleted meanwhile is left out."""

    def release(self, name: str, seqs: Sequence[int]) -> int:
        """Drop merged seqs from a name's index, each blob once no name needs it; idempotent."""

    def pending_names(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """Supercuboid names with pending blobs, oldest first."""

    def stats(self) -> BufferStats: ...


class MergeRequests(Protocol):
    """Merge rounds asked for (CLI, admin endpoint) and how each went."""

    def request_merge(self) -> str: ...

    def take_merge_requests(self) -> list[dict[str, str]]: ...

    def set_merge_status(self, request_id: str, status: dict[str, Any]) -> None: ...

    def merge_status(self, request_id: str) -> dict[str, Any] | None: ...


class MergerPresence(Protocol):
    """The live merger's heartbeat: it announces itself; the announcement expires without beats."""

    def announce_merger(self, info: dict[str, Any], ttl_s: float) -> None: ...

    def retire_merger(self) -> None: ...

    def merger(self) -> dict[str, Any] | None: ...


# -- the metrics every process adds into ------------------------------------------------------


@dataclass
class Histogram:
    buckets: list[float] = field(default_factory=lambda: [0.0] * (len(BUCKETS) + 1))  # per bucket, +Inf last
    sum: float = 0.0

    @property
    def count(self) -> float:
        return sum(self.buckets)


@dataclass
class Snapshot:
    counters: dict[tuple[str, str], float] = field(default_factory=dict)  # (name, labels json) -> total
    histograms: dict[tuple[str, str], Histogram] = field(default_factory=dict)

    @staticmethod
    def labels(raw: str) -> dict[str, Any]:
        """The labels of a key of `counters` or `histograms`."""
        return json.loads(raw)  # type: ignore[no-any-return]

    @staticmethod
    def labels_key(labels: Mapping[str, str]) -> str:
        """The labels as keys of `counters` and `histograms` write them: JSON, sorted, compact."""
        return json.dumps(labels, sort_keys=True, separators=(",", ":"))


class SharedMetrics(Observer, Protocol):
    """The engine's Observer whose counts every process adds into one shared table, read whole
    for `/metrics`. Recording never raises and costs no round trip; counts reach the table by
    `flush` (a background thread's, or the caller's)."""

    def flush(self) -> bool:
        """Add what this recorder counted into the table; False (kept for the next try) when the
        table cannot be reached. When it returns True, every count made before the call is in."""

    def close(self) -> bool:
        """Flush what is left; nothing is flushed in the background after."""

    def snapshot(self) -> Snapshot:
        """Every count every recorder has flushed."""

    def reset(self) -> None:
        """Forget every count, in the table and pending here (tests)."""
