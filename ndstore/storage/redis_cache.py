"""CuboidCache on Redis: the cuboids of resident supercuboids, the LRU index and the dirty set.

  ndc:{N}      hash: cuboid number -> blosc blob (b"" marks a cuboid known to be all zeros)
  ndc:index    sorted set: N -> last access time (s); which supercuboids are resident
  ndc:dirty    sorted set: N -> time it first became dirty; what the flusher must write back
  ndc:{N}:new  hash: a supercuboid's new cuboids while a put of many is under way (see `put`)
  {ndc:dirty}:seq    the writes numbered so far; {ndc:dirty}:seqs hash N -> seq of its newest
                     unflushed write; {ndc:dirty}:epoch the mark of the run whose holdings were
                     checked; {ndc:dirty}:lost hash N -> why it was lost (ndstore/engine/ledger.py)
  {ndc:dirty}:buffered      hash N -> seq of its newest NDBlaze write recorded before its answer
                            and not known merged; {ndc:dirty}:buffered-run the NDBlaze buffer's
                            run (its mark) that record describes (ndstore/engine/ledger.py)
N is a supercuboid's name (its volume partition and Morton code); the braces make it the hash
tag, so on Redis Cluster a supercuboid's cuboids live on one node, and the loss bookkeeping with
the dirty set. Every cuboid blob is stored with its xxh3-64 digest (field `#<number>`), checked on
every read: damaged bytes are refused (DamagedInCache), never decoded. Callers hold the
supercuboid's lock; this adapter only stores. One class implements every port of the cuboid
cache (ndstore/storage/interfaces.py).

Built with the RedisRWLocks that keep their keys in this same Redis, it also offers lock-free
reads and commits (`lock_free`, `RedisLockFree`): its scripts check those locks' keys in the
same atomic step, so the engine never sees a lock key. Never on a Cluster (keys in many slots).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redis
import xxhash
from redis.cluster import RedisCluster

from ndstore.core.errors import DamagedInCache, RedisUnverified, StorageError
from ndstore.core.geometry import CUBOID_BYTES
from ndstore.storage.interfaces import Held
from ndstore.storage.rwlock import RedisRWLocks

INDEX = "ndc:index"
DIRTY = "ndc:dirty"
SEQ = "{ndc:dirty}:seq"  # the {ndc:dirty} tag puts these in DIRTY's slot: one script may touch all
SEQS = "{ndc:dirty}:seqs"
EPOCH = "{ndc:dirty}:epoch"
LOST = "{ndc:dirty}:lost"
BUFFERED = "{ndc:dirty}:buffered"
BUFFERED_RUN = "{ndc:dirty}:buffered-run"
REFUSED = "ndc:refused"  # set and removed within one refused store's transaction (_ASIDE): never seen
UNVERIFIED = "UNVERIFIED"
STALE_RUN = "STALE_RUN"
# Redis appends each write command to its AOF buffer, which grows by at most 1 MiB at a time: a
# 16 MiB HSET of a whole supercuboid is copied over and over (measured: 250 MB/s). Commands of
# 8 cuboids of incompressible voxels (about 2 MiB) went at about 1 GB/s. So a command carries at
# most COMMAND_BYTES of blobs: 8 such cuboids, or as many compressed ones (labels, sparse or empty
# regions: a few KiB each) as fit, where a count of 8 sent their whole supercuboid in 8 commands
# (and staged any store of more than 8: docs/design/serving.md, "Redis commands and replies").
FIELDS_PER_COMMAND = 8
COMMAND_BYTES = FIELDS_PER_COMMAND * (CUBOID_BYTES + 1024)  # room for blosc's header on each
# Start a staging hash empty, or as a copy of the stored one when it has fields the new ones do
# not replace. COPY runs in Redis, and the AOF records the command, not the 16 MiB it copies.
# KEYS: the hash, its staging hash; ARGV: the fields about to be written.
_STAGE = """
redis.call('DEL', KEYS[2])
local new = {}
for i = 1, #ARGV do new[ARGV[i]] = true end
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not new[f] then redis.call('COPY', KEYS[1], KEYS[2]) return 1 end
end
return 1"""
# Cuboids go into Redis as plain HSETs inside a MULTI, not as a script's arguments: Redis copies
# those into Lua (1.6 ms of its CPU for the ~0.7 MB of a 64x64x8 write's cuboids, against 0.7 ms
# as an HSET in a MULTI; docs/design/serving.md, "Redis commands and replies"). A transaction cannot skip its later
# commands: when the script before the HSETs finds that the store must not happen, it calls
# `refuse`, which moves the hashes aside (RENAME, O(1)) and raises a flag; the HSETs land in fresh
# hashes, and the script after them calls `undone`, which drops those and moves the old hashes back. A transaction
# runs alone: no one sees the steps in between, and a refused store changes nothing. The script
# before must answer, not fail (an error half way would let the HSETs land unchecked): it reads
# only keys of the types it expects (ours) and renames a hash only after EXISTS. (Under maxmemory
# Redis refuses the HSETs while the MULTI is queued, and with them the whole transaction.)
# ``hashes``: {hash, where it is moved aside, ...}.
_ASIDE = """
local function refuse(flag, hashes)
  redis.call('SET', flag, '1')
  for i = 1, #hashes, 2 do
    if redis.call('EXISTS', hashes[i]) == 1 then redis.call('RENAME', hashes[i], hashes[i + 1]) end
  end
end
local function undone(flag, hashes)
  if redis.call('EXISTS', flag) == 0 then return false end
  redis.call('DEL', flag)
  for i = 1, #hashes, 2 do
    redis.call('DEL', hashes[i])
    if redis.call('EXISTS', hashes[i + 1]) == 1 then redis.call('RENAME', hashes[i + 1], hashes[i]) end
  end
  return true
end
"""
# A stored supercuboid marked resident (INDEX at ``now``) and, if ``dirty``, dirty (since its first
# unflushed write) with a fresh seq: what every store ends with.
_MARKED = """
local function marked(index, dirty_set, seq, seqs, name, now, dirty)
  redis.call('ZADD', index, now, name)
  if dirty then
    redis.call('ZADD', dirty_set, 'NX', now, name)
    redis.call('HSET', seqs, name, redis.call('INCR', seq))
  end
end
"""
# Before the HSET of a store that fits one command (`put`): refuse it in a Redis
# whose holdings were not checked. KEYS: EPOCH, REFUSED, the hash, where it is moved aside.
_GUARD = _ASIDE + """
if redis.call('EXISTS', KEYS[1]) == 0 then refuse(KEYS[2], {KEYS[3], KEYS[4]}) end
return 1"""
# Store one supercuboid's new cuboids (the HSETs before it in the MULTI, or its staged hash renamed
# over it) and mark it resident, and dirty with a fresh seq: all or nothing, and only in a Redis
# whose holdings were checked (refused, a staged hash is dropped). KEYS: its hash, its staging
# hash, INDEX, DIRTY, SEQ, SEQS, EPOCH, REFUSED, where _GUARD moved the hash aside; ARGV: name,
# now, dirty, staged.
_COMMIT = _ASIDE + _MARKED + """
if undone(KEYS[8], {KEYS[1], KEYS[9]}) or redis.call('EXISTS', KEYS[7]) == 0 then
  redis.call('DEL', KEYS[2])
  return redis.error_reply('UNVERIFIED')
end
if ARGV[4] == '1' then redis.call('RENAME', KEYS[2], KEYS[1]) end
marked(KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[1], ARGV[2], ARGV[3] == '1')
return 1"""
# On a Cluster the hash lives on another node: only the dirty mark and its seq here (KEYS: DIRTY,
# SEQ, SEQS, EPOCH; ARGV: name, now).
_MARK = """
if redis.call('EXISTS', KEYS[4]) == 0 then return redis.error_reply('UNVERIFIED') end
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], redis.call('INCR', KEYS[2]))
return 1"""
_CLEAN = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1"""
# Whether a lock-free snapshot may be taken: run first in a MULTI whose HMGETs read the cuboids
# (a transaction runs alone, as a script does, and the cuboids then go out without being copied
# through Lua: 16 cuboids through a script cost twice the locked read). 1 when the Redis is checked
# (EPOCH), no supercuboid is marked lost, each is resident and no writer holds its lock (a writer
# between its steps: a write, a page-in, an eviction, a direct write); else 0 and the caller
# drops what the HMGETs read. A supercuboid with an NDBlaze write recorded (BUFFERED) takes the
# locked path too, whose `guard` checks first that the NDBlaze buffer did not lose it. KEYS:
# EPOCH, LOST, INDEX, BUFFERED, then each one's writer-lock key; ARGV: the supercuboids' names.
_SNAPSHOT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 1, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 or not redis.call('ZSCORE', KEYS[3], ARGV[i])
      or redis.call('HEXISTS', KEYS[4], ARGV[i]) == 1 or redis.call('EXISTS', KEYS[4 + i]) == 1 then return 0 end
end
return 1"""
# A write made without locks (ndstore/engine/cache/lock_free.py) is applied only if nothing it relied on changed
# since its snapshot: the Redis is checked, no supercuboid is lost, each is resident, no one holds
# its lock (a writer between its steps, or a reader: the flusher writes back under a read lock and
# then clears the dirty mark, which must not forget this write), and each partly covered cuboid it
# merged into still has the digest it read, and no NDBlaze write to it is recorded (as _SNAPSHOT).
# `commit_unlocked` sends one MULTI: _CHECK_COMMIT, the HSETs of the new cuboids, _FINISH_COMMIT
# (see _ASIDE). KEYS: EPOCH, LOST, INDEX, REFUSED, BUFFERED, then per supercuboid its hash, its
# lock's readers and writer, where its hash is moved aside; ARGV: per supercuboid its name, the
# count of digests expected and (field, digest) pairs.
_CHECK_COMMIT = _ASIDE + """
local ok = redis.call('EXISTS', KEYS[1]) == 1
local at = 1
local count = (#KEYS - 5) / 4
for i = 1, count do
  local b = 5 + 4 * (i - 1)
  local name = ARGV[at]
  if ok and (redis.call('HEXISTS', KEYS[2], name) == 1 or not redis.call('ZSCORE', KEYS[3], name)
      or redis.call('HEXISTS', KEYS[5], name) == 1
      or redis.call('EXISTS', KEYS[b + 3]) == 1 or redis.call('ZCARD', KEYS[b + 2]) > 0) then ok = false end
  local expected = tonumber(ARGV[at + 1])
  for j = 0, expected - 1 do
    if ok and redis.call('HGET', KEYS[b + 1], ARGV[at + 2 + 2 * j]) ~= ARGV[at + 3 + 2 * j] then ok = false end
  end
  at = at + 2 + 2 * expected
end
if ok then return 1 end
local hashes = {}
for i = 1, count do
  local b = 5 + 4 * (i - 1)
  table.insert(hashes, KEYS[b + 1])
  table.insert(hashes, KEYS[b + 4])
end
refuse(KEYS[4], hashes)
return 0"""
# The new cuboids marked resident and dirty with a fresh seq, unless _CHECK_COMMIT refused them.
# KEYS: INDEX, DIRTY, SEQ, SEQS, REFUSED, then per supercuboid its hash and where it was moved
# aside; ARGV: now, then the supercuboids' names. 1 when the write was applied.
_FINISH_COMMIT = _ASIDE + _MARKED + """
if undone(KEYS[5], {unpack(KEYS, 6)}) then return 0 end
for i = 2, #ARGV do marked(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[i], ARGV[1], true) end
return 1"""
# A page-in's cuboids are clean copies of what the base tier holds: Redis neither logs them to its
# AOF nor sends them to replicas (REPL_NONE). Redis copies a script's arguments into Lua (~1.4 ms
# of its CPU per MB here), so a page-in costs it about what the logged HSETs did (14 MB of cuboids:
# 24 ms against 18-20), but it writes and fsyncs nothing: the AOF grows with writes, not reads, and
# Redis no longer stalls every client on a 14 MB fsync (two clients' cold reads ~30% faster).
# After a restart a supercuboid that was written holds what its writes logged; the cuboids it
# lacks are clean and read again from the base tier (see ndstore/engine/cache/copies.py, Copies.restore, and
# docs/design/cache-tier.md, "Page-ins are not logged").
# A copy is stored only in the run it was fetched in (EPOCH still the mark the caller read before
# it fetched): one fetched before a restart that lost the Redis's data (and with it the lock the
# copy was fetched under) would otherwise land over what a writer stored since. A fill (of the
# cuboids a resident supercuboid lacks) sets only fields still absent: a writer's never lose to it.
# KEYS: the hash, EPOCH; ARGV: the run, '1' to set only absent cuboids, then (cuboid, blob, digest
# field, digest) quads.
_FILL = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return redis.error_reply('STALE_RUN') end
redis.set_repl(redis.REPL_NONE)
if ARGV[2] == '1' then
  for i = 3, #ARGV, 4 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    end
  end
else
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
end
return 1"""
# A paged-in supercuboid marked resident, unlogged too (after a restart it is simply not
# resident), and only in the run its copy was fetched in. KEYS: INDEX, EPOCH; ARGV: name, now, run.
_PAGED_IN = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return redis.error_reply('STALE_RUN') end
redis.set_repl(redis.REPL_NONE)
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1"""
# Access times for the LRU order, not logged either: a restart forgets a little of who read what
# last, and a read then writes nothing to the AOF, so with `appendfsync always` it no longer waits
# for an fsync before its reply. KEYS: INDEX; ARGV: now, then the names (only resident ones move).
_TOUCH = """
redis.set_repl(redis.REPL_NONE)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i]) end
return 1"""
_HELD = """
return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[3])}"""
# The record of NDBlaze writes (ndstore/engine/ledger.py, "The record"). _RECORD: each name's
# newest seq, only while the record describes the run the write was taken in (0: it describes
# another, or none). KEYS: BUFFERED, BUFFERED_RUN; ARGV: the run, then (name, seq) pairs.
_RECORD = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do
  if tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1"""
# Merged up to a seq: a name whose recorded seq is no later is dropped (a later write keeps it).
# KEYS: BUFFERED; ARGV: (name, seq) pairs.
_FORGET = """
for i = 1, #ARGV, 2 do
  local seq = redis.call('HGET', KEYS[1], ARGV[i])
  if seq and tonumber(seq) <= tonumber(ARGV[i + 1]) then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
return 1"""
# The record brought to what the buffer holds: started afresh for another run; a name recorded
# no later than the buffer's counter ``seq`` that the buffer no longer holds is merged (dropped);
# each held one at least at its held seq. A name recorded later than ``seq`` stays: its write
# came after the buffer's account was read. KEYS: BUFFERED, BUFFERED_RUN; ARGV: run, seq, then
# the held (name, seq) pairs.
_SYNC = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], ARGV[1])
end
local held = {}
for i = 3, #ARGV, 2 do held[ARGV[i]] = tonumber(ARGV[i + 1]) end
local recorded = redis.call('HGETALL', KEYS[1])
for i = 1, #recorded, 2 do
  if tonumber(recorded[i + 1]) <= tonumber(ARGV[2]) and not held[recorded[i]] then
    redis.call('HDEL', KEYS[1], recorded[i])
  end
end
for name, seq in pairs(held) do
  if tonumber(redis.call('HGET', KEYS[1], name) or '0') < seq then redis.call('HSET', KEYS[1], name, seq) end
end
return 1"""
_BUFFERED = """
return {redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[1])}"""
_START = """
redis.call('SET', KEYS[1], ARGV[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
return 1"""


def digest_field(number: int | str) -> str:
    return f"#{number}"


def _digest(blob: bytes | memoryview) -> bytes:
    return xxhash.xxh3_64_digest(blob)


def _in_batches(blobs: Mapping[int, bytes | memoryview]) -> Iterator[list[Any]]:
    """``blobs`` (cuboid -> blob) as one HSET's items per run of at most COMMAND_BYTES of blobs (at
    least one cuboid each), in order: each cuboid's field and blob, then its digest's field and
    digest."""
    batch: list[Any] = []
    size = 0
    for n, b in blobs.items():
        if batch and size + len(b) > COMMAND_BYTES:
            yield batch
            batch, size = [], 0
        batch += (str(n), b, digest_field(n), _digest(b))
        size += len(b)
    if batch:
        yield batch


def _checked(name: str, numbers: Sequence[int], reply: list[bytes | None]) -> list[bytes | None]:
    """The blobs of an HMGET of ``numbers`` then their digests; a blob whose digest is stored
    and differs is damage (a missing digest is a blob stored before digests were)."""
    count = len(numbers)
    for number, blob, digest in zip(numbers, reply[:count], reply[count:]):
        if blob is not None and digest is not None and _digest(blob) != digest:
            raise DamagedInCache(name, f"cuboid {number} does not match its checksum")
    return reply[:count]


def _hash(name: str) -> str:
    return f"ndc:{{{name}}}"


def _staging(name: str) -> str:
    return f"ndc:{{{name}}}:new"


def _aside(name: str) -> str:
    """Where a refused lock-free commit moves the hash for the length of its transaction."""
    return f"ndc:{{{name}}}:aside"


def _fields(numbers: Sequence[int]) -> list[str]:
    """The cuboids' fields then their digests' fields."""
    return [str(n) for n in numbers] + [digest_field(n) for n in numbers]


class RedisCuboidCache:
    def __init__(self, client: redis.Redis, locks: RedisRWLocks | None = None):
        """``locks``: the readers-writer locks of the cache's supercuboids when they keep their
        keys in this same Redis (ValueError if they do not): small reads and writes may then
        go without them (`lock_free`), except on a Cluster. None: every request takes the locks."""
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._lock_free: RedisLockFree | None = None
        if locks is not None and not self._cluster:  # a Cluster never: a script sees one slot's keys
            if not locks.same_redis(client):
                raise ValueError("lock-free commits need the locks' keys in the cache's own Redis")
            self._lock_free = RedisLockFree(client, locks)
        self._stage = client.register_script(_STAGE)
        self._commit = client.register_script(_COMMIT)
        self._mark = client.register_script(_MARK)
        self._clean = client.register_script(_CLEAN)
        self._held = client.register_script(_HELD)
        self._start = client.register_script(_START)
        self._record = client.register_script(_RECORD)
        self._forget = client.register_script(_FORGET)
        self._sync = client.register_script(_SYNC)
        self._buffered = client.register_script(_BUFFERED)

    def resident(self, names: Sequence[str]) -> list[bool]:
        if not names:
            return []
        scores = _do(lambda: self._redis.zmscore(INDEX, list(names)))
        return [s is not None for s in scores]

    def get_many(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None]]:
        """HMGET the given cuboid numbers of each supercuboid, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for name, numbers in wanted.items():
            pipe.hmget(_hash(name), _fields(numbers))
        replies = _do(pipe.execute)
        return {name: _checked(name, numbers, reply) for (name, numbers), reply in zip(wanted.items(), replies)}

    @property
    def lock_free(self) -> RedisLockFree | None:
        return self._lock_free

    def get_if_resident(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None] | None]:
        """The given cuboids of each supercuboid that is resident, None for one that is not; one
        round trip for both questions (the write path's, under the supercuboids' write locks)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zmscore(INDEX, list(wanted))
        asked = [name for name, numbers in wanted.items() if numbers]
        for name in asked:
            pipe.hmget(_hash(name), _fields(wanted[name]))
        scores, *replies = _do(pipe.execute)
        blobs = {name: _checked(name, wanted[name], reply) for name, reply in zip(asked, replies)}
        return {name: (blobs.get(name, []) if score is not None else None) for name, score in zip(wanted, scores)}

    def get_all(self, name: str, count: int) -> list[bytes | None]:
        return self.get_many({name: range(count)})[name]

    def put(self, name: str, blobs: Mapping[int, bytes | memoryview], now: float, dirty: bool) -> None:
        """Store cuboid blobs and record the supercuboid resident (and dirty if asked), all or
        nothing: a writer that dies half way (SIGKILL, a lost connection) leaves the old cuboids,
        never some of each. Blobs that fit one command (COMMAND_BYTES) go in one HSET; more are
        written into a staging hash (a copy of the stored one unless they replace all of it) at
        pipeline speed and renamed over it. That HSET runs in one MULTI with the marks' script (see _ASIDE), the
        RENAME in that script (one MULTI of every HSET would be atomic too, but Redis then
        buffers 16 MiB of AOF at once: 3x slower); either refuses (RedisUnverified) in a Redis
        whose holdings were not checked, having changed nothing.
        On a Cluster a script holds one slot's keys: the supercuboid is marked dirty before it
        changes (a writer dying then leaves it unchanged, written back as it is) and resident after."""
        main = _hash(name)
        batches = list(_in_batches(blobs))
        staged = len(batches) > 1
        if staged:
            _do(lambda: self._stage(keys=[main, _staging(name)], args=_fields(list(blobs))))
            pipe = self._redis.pipeline(transaction=False)
            for batch in batches:
                pipe.hset(_staging(name), items=batch)
            _do(pipe.execute)
        if self._cluster:
            if dirty:
                _do(lambda: self._mark(keys=[DIRTY, SEQ, SEQS, EPOCH], args=[name, now]))
            if staged:
                _do(lambda: self._redis.rename(_staging(name), main))
            elif batches:
                _do(lambda: self._redis.hset(main, items=batches[0]))
            _do(lambda: self._redis.zadd(INDEX, {name: now}))
            return
        commit_keys = [main, _staging(name), INDEX, DIRTY, SEQ, SEQS, EPOCH, REFUSED, _aside(name)]
        if staged:
            _do(lambda: self._commit(keys=commit_keys, args=[name, now, int(dirty), 1]))
            return
        pipe = self._redis.pipeline(transaction=True)  # the cuboids as an HSET, not through Lua (_ASIDE)
        pipe.eval(_GUARD, 4, EPOCH, REFUSED, main, _aside(name))
        if batches:  # not staged: one
            pipe.hset(main, items=batches[0])
        pipe.eval(_COMMIT, len(commit_keys), *commit_keys, name, now, int(dirty), 0)
        _do(pipe.execute)

    def page_in(self, name: str, blobs: Mapping[int, bytes | memoryview], now: float, run: str) -> None:
        """Store a supercuboid's clean cuboids, copied from the base tier, and mark it resident,
        neither logged to the AOF (see _FILL). The caller holds its write lock and it was not
        resident: a page-in that dies half way leaves it not resident, and the next one writes
        every field again. Refused (RedisUnverified) unless this Redis is still in ``run`` (its
        checked mark, read before the copy was fetched). On a Cluster, logged as `put` stores
        (its replicas would otherwise lack them), and the mark (in another slot) only exists."""
        if self._cluster:
            self.put(name, blobs, now, dirty=False)
            return
        pipe = self._redis.pipeline(transaction=False)
        self._fill_into(pipe, name, blobs, run, only_absent=False)
        pipe.eval(_PAGED_IN, 2, INDEX, EPOCH, name, now, run)
        _do(pipe.execute)

    def fill(self, name: str, blobs: Mapping[int, bytes | memoryview], run: str) -> None:
        """Store clean cuboids a resident supercuboid lacks (copied from the base tier), unlogged
        as a page-in's and only in ``run``; a cuboid stored since (a write) is left as it is."""
        pipe = self._redis.pipeline(transaction=False)
        self._fill_into(pipe, name, blobs, run, only_absent=True)
        _do(pipe.execute)

    def _fill_into(self, pipe: Any, name: str, blobs: Mapping[int, bytes | memoryview], run: str,
                   only_absent: bool) -> None:
        for quads in _in_batches(blobs):
            if self._cluster:
                pipe.hset(_hash(name), items=quads)
            else:
                pipe.eval(_FILL, 2, _hash(name), EPOCH, run, int(only_absent), *quads)

    def absent(self, name: str, numbers: Sequence[int]) -> list[int]:
        """Which of ``numbers`` (cuboids, or META's -1) have no field in the supercuboid's hash."""
        fields = {f.decode() for f in _do(lambda: self._redis.hkeys(_hash(name)))}
        return [n for n in numbers if str(n) not in fields]

    def touch(self, names: Sequence[str], now: float) -> None:
        if names and self._cluster:
            _do(lambda: self._redis.zadd(INDEX, {n: now for n in names}, xx=True))
        elif names:
            _do(lambda: self._redis.eval(_TOUCH, 1, INDEX, now, *names))

    def dirty_before(self, when: float, limit: int) -> list[str]:
        names = _do(lambda: self._redis.zrangebyscore(DIRTY, "-inf", when, start=0, num=limit))
        return [n.decode() for n in names]

    def oldest_dirty(self) -> float | None:
        first = _do(lambda: self._redis.zrange(DIRTY, 0, 0, withscores=True))
        return float(first[0][1]) if first else None

    def is_dirty(self, names: Sequence[str]) -> list[bool]:
        if not names:
            return []
        return [s is not None for s in _do(lambda: self._redis.zmscore(DIRTY, list(names)))]

    def clear_dirty(self, name: str) -> None:
        _do(lambda: self._clean(keys=[DIRTY, SEQS], args=[name]))

    def evict(self, name: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(_hash(name))
        pipe.delete(_staging(name))  # what a writer that died half way left staged
        pipe.zrem(INDEX, name)
        pipe.zrem(DIRTY, name)
        pipe.hdel(SEQS, name)
        _do(pipe.execute)

    def names_with_prefix(self, prefix: str) -> list[str]:
        """Resident or dirty supercuboids whose names start with ``prefix`` (bulk operations only)."""
        def scan(key: str) -> list[str]:
            return [n.decode() for n, _ in self._redis.zscan_iter(key, match=prefix + "*")]

        return sorted(set(_do(lambda: scan(INDEX) + scan(DIRTY))))

    def coldest(self, count: int) -> list[str]:
        return [n.decode() for n in _do(lambda: self._redis.zrange(INDEX, 0, count - 1))]

    def used_memory(self) -> int:
        """Bytes Redis uses; on a Cluster, the most any one node uses (each evicts its own)."""
        info = _do(lambda: self._redis.info("memory"))
        if "used_memory" in info:
            return int(info["used_memory"])
        return max(int(node["used_memory"]) for node in info.values())

    def count(self) -> tuple[int, int]:
        """(resident, dirty) supercuboid counts."""
        return _do(lambda: self._redis.zcard(INDEX)), _do(lambda: self._redis.zcard(DIRTY))

    # -- what it holds unflushed, and what was lost (ndstore/engine/ledger.py) ----------------
    def held(self) -> Held:
        epoch, seq, pairs = _do(lambda: self._held(keys=[EPOCH, SEQ, SEQS]))
        return Held(epoch.decode() if epoch else None, int(seq or 0),
                    {pairs[i].decode(): int(pairs[i + 1]) for i in range(0, len(pairs), 2)})

    def start_epoch(self, epoch: str, seq: int) -> None:
        _do(lambda: self._start(keys=[EPOCH, SEQ], args=[epoch, seq]))

    def clear_epoch(self) -> None:
        _do(lambda: self._redis.delete(EPOCH))

    def loss_marks(self, names: Sequence[str]) -> tuple[str | None, dict[str, str], str | None]:
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(EPOCH)
        if names:
            pipe.hmget(LOST, list(names))
            pipe.get(BUFFERED_RUN)
            pipe.hmget(BUFFERED, list(names))
        run, *rest = _do(pipe.execute)
        why, buffered_run, recorded = rest if rest else ([], None, [])
        lost = {n: w.decode() for n, w in zip(names, why) if w is not None}
        buffered: str | None = None
        if names and buffered_run is None:
            buffered = ""  # no record: to be rebuilt from the buffer
        elif any(r is not None for r in recorded):
            buffered = buffered_run.decode()
        return run.decode() if run else None, lost, buffered

    def mark_lost(self, reasons: Mapping[str, str]) -> None:
        if reasons:
            _do(lambda: self._redis.hset(LOST, mapping=dict(reasons)))  # type: ignore[arg-type]

    def lost(self) -> dict[str, str]:
        raw: dict[bytes, bytes] = _do(lambda: self._redis.hgetall(LOST))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def forget_lost(self, names: Sequence[str]) -> None:
        if names:
            _do(lambda: self._redis.hdel(LOST, *names))

    # -- the record of NDBlaze writes (ndstore/engine/ledger.py) --------------------------------
    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool:
        args = [run, *(v for name, seq in seqs.items() for v in (name, seq))]
        return bool(_do(lambda: self._record(keys=[BUFFERED, BUFFERED_RUN], args=args)))

    def forget_buffered(self, seqs: Mapping[str, int]) -> None:
        if seqs:
            args = [v for name, seq in seqs.items() for v in (name, seq)]
            _do(lambda: self._forget(keys=[BUFFERED], args=args))

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        args = [run, seq, *(v for name, s in held.items() for v in (name, s))]
        _do(lambda: self._sync(keys=[BUFFERED, BUFFERED_RUN], args=args))

    def buffered(self) -> tuple[str | None, dict[str, int]]:
        run, pairs = _do(lambda: self._buffered(keys=[BUFFERED, BUFFERED_RUN]))
        return run.decode() if run else None, {pairs[i].decode(): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    def drop_buffered(self) -> None:
        _do(lambda: self._redis.delete(BUFFERED, BUFFERED_RUN))



def _do(fn: Callable[[], Any]) -> Any:
    """``fn()``, its Redis errors as the domain's."""
    try:
        return fn()
    except redis.ResponseError as exc:
        reply = str(exc).rpartition("caused error: ")[2]  # a pipeline's error names its command first
        if reply.startswith(UNVERIFIED):
            raise RedisUnverified("the cache Redis has not been checked against its ledger since it started; "
                                  "nothing is stored in it until it is (retry shortly)") from exc
        if reply.startswith(STALE_RUN):
            raise RedisUnverified("the cache Redis restarted without its data while a copy from the base tier "
                                  "was on its way in; it was not stored (retry)") from exc
        raise StorageError(f"cache tier unavailable: {exc}") from exc
    except redis.RedisError as exc:
        raise StorageError(f"cache tier unavailable: {exc}") from exc


class RedisLockFree:
    """Lock-free reads and commits (LockFreeCommits) in the cache's Redis, which also keeps the
    keys of ``locks``: each script checks, in the same atomic step, that no one holds the
    supercuboids' locks (see _SNAPSHOT and _CHECK_COMMIT). Made by RedisCuboidCache, never on a
    Cluster."""

    def __init__(self, client: redis.Redis, locks: RedisRWLocks):
        self._redis = client
        self._keys = locks.keys

    def read_unlocked(self, wanted: Mapping[str, Sequence[int]], now: float) -> dict[str, list[bytes | None]] | None:
        """The given cuboids of each supercuboid as one atomic snapshot, taken without locks, in
        one round trip; None (take the locked path) unless this Redis was checked, none of them
        is marked lost or missing, and no writer holds one."""
        seen = self.read_for_update(wanted, now)
        return None if seen is None else {name: blobs for name, (blobs, _) in seen.items()}

    def read_for_update(self, wanted: Mapping[str, Sequence[int]],
                        now: float) -> dict[str, tuple[list[bytes | None], list[bytes | None]]] | None:
        """`read_unlocked`, with each blob's stored digest: what `commit_unlocked` checks."""
        if not wanted:
            return None
        names = list(wanted)
        pipe = self._redis.pipeline(transaction=True)
        pipe.eval(_SNAPSHOT, 4 + len(names), EPOCH, LOST, INDEX, BUFFERED, *(self._keys(n)[1] for n in names), *names)
        asked = [name for name in names if wanted[name]]
        for name in asked:
            pipe.hmget(_hash(name), _fields(wanted[name]))
        pipe.eval(_TOUCH, 1, INDEX, now, *names)
        ok, *replies, _ = _do(pipe.execute)
        if not ok:
            return None
        got = dict(zip(asked, replies))
        return {name: (_checked(name, numbers, got[name]), got[name][len(numbers):]) if numbers else ([], [])
                for name, numbers in wanted.items()}

    def commit_unlocked(self, blobs: Mapping[str, Mapping[int, bytes]], expected: Mapping[str, Mapping[int, bytes]],
                        now: float) -> bool:
        """Store each supercuboid's new cuboid blobs and mark it dirty, all of them or none, only
        if no one holds its lock and the cuboids in ``expected`` still have those digests (see
        _CHECK_COMMIT); one round trip. False: nothing was stored."""
        check_keys: list[str] = [EPOCH, LOST, INDEX, REFUSED, BUFFERED]
        check_args: list[Any] = []
        finish_keys: list[str] = [INDEX, DIRTY, SEQ, SEQS, REFUSED]
        for name in blobs:
            check_keys += [_hash(name), *self._keys(name), _aside(name)]
            digests = expected.get(name, {})
            check_args += [name, len(digests), *(v for n, d in digests.items() for v in (digest_field(n), d))]
            finish_keys += [_hash(name), _aside(name)]
        pipe = self._redis.pipeline(transaction=True)
        pipe.eval(_CHECK_COMMIT, len(check_keys), *check_keys, *check_args)
        for name, new in blobs.items():
            for batch in _in_batches(new):  # inside the MULTI: still all or nothing
                pipe.hset(_hash(name), items=batch)
        pipe.eval(_FINISH_COMMIT, len(finish_keys), *finish_keys, now, *blobs)
        return bool(_do(pipe.execute)[-1])
