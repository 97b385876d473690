"""The NDBlaze buffer's adapters over a Redis of its own (one node): pending writes stored as they
arrived (BlazeBuffer), on-demand merge requests (MergeRequests) and the merger's heartbeat
(MergerPresence). Every Redis failure is a StorageError (503 with Retry-After at the API).

Keys (see docs/design/blaze.md):
  blz:seq              the last sequence number handed out (INCR: monotonic across processes)
  blz:blob:<seq>       hash: h = header JSON, n = body parts, size = body bytes,
                       refs = supercuboids still to merge it, at = arrival (ms),
                       x = xxh3-64 of the body (checked on every read: damage is DataCorrupt)
  blz:blob:<seq>:<i>   string: part i of the body (64 MiB each). Strings, not hash fields:
                       Redis stores a SET's value as it arrived but copies an HSET's.
  blz:sc:<name>        sorted set of the seqs of pending blobs touching supercuboid <name>
  blz:pending          sorted set of supercuboid names with pending blobs, score = oldest seq
  blz:bytes            body bytes pending (the back-pressure counter); blz:count, blobs pending
  blz:merge:requests   list of on-demand merge requests; blz:merge:status hash id -> JSON
  blz:merger           the live merger's announcement (expires without heartbeats)
  blz:epoch            the mark of the run whose holdings were checked against the ledger
                       (ndstore/engine/ledger.py): no write is taken and no pending blob read
                       without it (RedisUnverified)
An append is one MULTI: the body goes to fresh keys, then a Lua script checks the limit,
takes a sequence number, renames the blob's keys to carry it, and indexes it under every
supercuboid it touches; so a blob is either wholly pending or absent, never half-indexed.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import xxhash

from ndstore.core.errors import BufferFull, DataCorrupt, RedisUnverified, StorageError
from ndstore.storage.interfaces import BufferStats, Held, PendingBlob

T = TypeVar("T")

BULK_BYTES = 16 << 20  # appends larger than this go over the client with the longer timeout
PART_BYTES = 64 << 20  # Redis caps one value at 512 MB; big bodies are stored in parts
SEQ_DIGITS = 16

_APPEND = """
local size, parts = tonumber(ARGV[1]), tonumber(ARGV[3])
local pending = tonumber(redis.call('GET', KEYS[3]) or '0')
local unchecked = redis.call('EXISTS', 'blz:epoch') == 0
if unchecked or (pending > 0 and pending + size > tonumber(ARGV[2])) then
  redis.call('DEL', KEYS[1])
  for i = 0, parts - 1 do redis.call('DEL', KEYS[1] .. ':' .. i) end
  if unchecked then return {-2} end
  return {-1}
end
local seq = redis.call('INCR', KEYS[2])
local key = string.format('blz:blob:%016d', seq)
local t = redis.call('TIME')
redis.call('RENAME', KEYS[1], key)
redis.call('PERSIST', key)
for i = 0, parts - 1 do
  redis.call('RENAME', KEYS[1] .. ':' .. i, key .. ':' .. i)
  redis.call('PERSIST', key .. ':' .. i)
end
redis.call('HSET', key, 'refs', #ARGV - 3, 'size', size, 'at', t[1] * 1000 + math.floor(t[2] / 1000))
redis.call('INCRBY', KEYS[3], size)
redis.call('INCR', KEYS[5])
for i = 4, #ARGV do
  redis.call('ZADD', 'blz:sc:' .. ARGV[i], seq, seq)
  redis.call('ZADD', KEYS[4], 'NX', seq, ARGV[i])
end
return {seq, redis.call('GET', 'blz:epoch')}
"""
_RELEASE = """
local released = 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    released = released + 1
    local key = string.format('blz:blob:%016d', tonumber(ARGV[i]))
    if redis.call('EXISTS', key) == 1 and redis.call('HINCRBY', key, 'refs', -1) <= 0 then
      redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', key, 'size') or '0'))
      for p = 0, tonumber(redis.call('HGET', key, 'n') or '1') - 1 do redis.call('DEL', key .. ':' .. p) end
      redis.call('DEL', key)
      redis.call('DECR', KEYS[4])
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 0 then redis.call('ZREM', KEYS[2], ARGV[1]) else redis.call('ZADD', KEYS[2], first[2], ARGV[1]) end
return released
"""


_HELD = """
local out = {}
for _, name in ipairs(redis.call('ZRANGE', 'blz:pending', 0, -1)) do
  local newest = redis.call('ZRANGE', 'blz:sc:' .. name, -1, -1)
  if #newest > 0 then out[#out + 1] = name; out[#out + 1] = newest[1] end
end
return {redis.call('GET', 'blz:epoch'), redis.call('GET', 'blz:seq'), out}"""
_START = """
redis.call('SET', 'blz:epoch', ARGV[1])
if tonumber(redis.call('GET', 'blz:seq') or '0') < tonumber(ARGV[2]) then redis.call('SET', 'blz:seq', ARGV[2]) end
return 1"""
UNCHECKED = "the NDBlaze buffer's Redis has not been checked against its ledger since it started"


def blob_key(seq: int) -> str:
    return f"blz:blob:{seq:0{SEQ_DIGITS}d}"


def _storage_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Redis failures of a buffer call as StorageError, naming the call."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except redis.exceptions.RedisError as exc:
            raise StorageError(f"the NDBlaze buffer's Redis failed in {fn.__name__}: {exc}") from exc
    return call


class RedisBlazeBuffer:
    def __init__(self, client: redis.Redis, max_pending_bytes: int, bulk: redis.Redis | None = None):
        """``bulk``: the client for appends of more than BULK_BYTES, whose answer waits for Redis to
        store (and fsync) the whole body: a longer timeout than ``client``'s (the default: client)."""
        self.client = client
        self._bulk = bulk or client
        self.max_pending_bytes = max_pending_bytes
        self._release = client.register_script(_RELEASE)
        self._held = client.register_script(_HELD)
        self._start = client.register_script(_START)

    # -- the write path ----------------------------------------------------------------------
    def append(self, header: bytes, body: bytes, names: Sequence[str]) -> int:
        """Store one body under every supercuboid name it touches; returns its sequence number.
        Raises BufferFull when the pending bytes would pass the limit (nothing is stored)."""
        return self.append_in_run(header, body, names)[0]

    def append_in_run(self, header: bytes, body: bytes, names: Sequence[str]) -> tuple[int, str]:
        """`append`, returning its sequence number and the mark of the checked run that took it
        (`blz:epoch`), read in the same step: what the record of the write names (see
        ndstore/engine/ledger.py)."""
        tmp = f"blz:new:{secrets.token_hex(8)}"
        view = memoryview(body)
        parts = [view[i:i + PART_BYTES] for i in range(0, len(body), PART_BYTES)] or [view]
        pipe = (self._bulk if len(body) > BULK_BYTES else self.client).pipeline(transaction=True)
        pipe.hset(tmp, mapping={"h": header, "n": len(parts), "x": xxhash.xxh3_64_digest(body)})
        pipe.pexpire(tmp, 3_600_000)  # an orphan of a failed transaction does not stay for ever
        for i, part in enumerate(parts):
            pipe.set(f"{tmp}:{i}", part, px=3_600_000)
        # EVAL, not a registered script: redis-py checks a pipeline's scripts with SCRIPT EXISTS
        # before it sends the pipeline, a second round trip on every write
        pipe.eval(_APPEND, 5, tmp, "blz:seq", "blz:bytes", "blz:pending", "blz:count",
                  len(body), self.max_pending_bytes, len(parts), *names)
        try:
            seq, *run = pipe.execute()[-1]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StorageError(f"the NDBlaze buffer did not answer ({exc}); the write may not have been stored: "
                               "retry it") from exc
        except (redis.exceptions.ResponseError, redis.exceptions.ExecAbortError) as exc:
            if "OOM" in str(exc):
                raise BufferFull("the NDBlaze buffer's Redis is out of memory; retry after the next merge") from None
            raise StorageError(f"the NDBlaze buffer refused the write: {exc}") from exc
        if seq == -2:
            raise RedisUnverified(f"{UNCHECKED}; the write was not stored: retry it")
        if seq < 0:
            raise BufferFull(f"the NDBlaze buffer holds more than {self.max_pending_bytes} bytes awaiting merge; "
                             "retry after the next merge")
        return int(seq), run[0].decode()

    # -- the read and merge paths ------------------------------------------------------------
    @_storage_errors
    def pending_seqs(self, names: Sequence[str]) -> dict[str, list[int]]:
        """The pending seqs of each name, ascending, read as one atomic snapshot; RedisUnverified
        from a Redis whose holdings were not checked (what it holds may be older than the ledger)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.exists("blz:epoch")
        for name in names:
            pipe.zrange(f"blz:sc:{name}", 0, -1)
        checked, *replies = pipe.execute()
        if not checked:
            raise RedisUnverified(UNCHECKED)
        return {name: [int(s) for s in seqs] for name, seqs in zip(names, replies)}

    @_storage_errors
    def blobs(self, seqs: Sequence[int]) -> list[PendingBlob]:
        """The blobs of ``seqs`` in seq order; a blob merged and deleted meanwhile is skipped."""
        ordered = sorted(seqs)
        pipe = self.client.pipeline(transaction=False)
        for seq in ordered:
            pipe.hmget(blob_key(seq), "h", "n", "x")
            pipe.get(f"{blob_key(seq)}:0")
        replies = pipe.execute()
        out = []
        for seq, (header, parts, digest), first in zip(ordered, replies[0::2], replies[1::2]):
            if header is None or first is None:
                continue  # merged and deleted since the snapshot
            body = first
            if int(parts) > 1:
                rest: list[bytes | None] = self.client.mget(  # type: ignore[assignment]
                    [f"{blob_key(seq)}:{i}" for i in range(1, int(parts))])
                if any(r is None for r in rest):
                    continue
                body = b"".join([first, *(r for r in rest if r is not None)])
            if digest is not None and xxhash.xxh3_64_digest(body) != digest:
                raise DataCorrupt(f"NDBlaze write {seq} is damaged in the buffer's Redis (its body does not match its "
                                  "checksum); it stays pending, unapplied")
            out.append(PendingBlob(seq, header, body))
        return out

    @_storage_errors
    def release(self, name: str, seqs: Sequence[int]) -> int:
        """Drop merged ``seqs`` from ``name``'s index, deleting each blob once no supercuboid
        still needs it. Atomic; releasing twice is harmless. Returns how many were released."""
        return int(self._release(keys=[f"blz:sc:{name}", "blz:pending", "blz:bytes", "blz:count"], args=[name, *seqs]))

    @_storage_errors
    def pending_names(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """Supercuboid names with pending blobs, oldest first (optionally of one channel)."""
        raw: list[bytes] = self.client.zrange("blz:pending", 0, -1)  # type: ignore[assignment]
        names = [n.decode() for n in raw]
        names = [n for n in names if n.startswith(prefix)]
        return names[:limit] if limit is not None else names

    @_storage_errors
    def stats(self) -> BufferStats:
        pipe = self.client.pipeline(transaction=True)
        for command, args in (("get", ("blz:bytes",)), ("zcard", ("blz:pending",)), ("zrange", ("blz:pending", 0, 0)),
                              ("get", ("blz:count",)), ("time", ())):
            getattr(pipe, command)(*args)
        raw_bytes, names, oldest, blobs, (secs, micros) = pipe.execute()
        age = None
        first = self._first_seq(oldest[0].decode()) if oldest else None
        if first is not None:
            at = self.client.hget(blob_key(first), "at")
            age = max(0.0, secs + micros / 1e6 - int(at) / 1000) if at else None
        return BufferStats(int(raw_bytes or 0), int(blobs or 0), int(names), age)

    # -- what it holds unflushed (ndstore/engine/ledger.py) -----------------------------------
    @_storage_errors
    def held(self) -> Held:
        epoch, seq, pairs = self._held(keys=[], args=[])
        return Held(epoch.decode() if epoch else None, int(seq or 0),
                    {pairs[i].decode(): int(pairs[i + 1]) for i in range(0, len(pairs), 2)})

    @_storage_errors
    def mark(self) -> str | None:
        """The mark of the checked run (`blz:epoch`), None without one: one GET."""
        epoch: bytes | None = self.client.get("blz:epoch")  # type: ignore[assignment]
        return epoch.decode() if epoch else None

    @_storage_errors
    def start_epoch(self, epoch: str, seq: int) -> None:
        self._start(keys=[], args=[epoch, seq])

    @_storage_errors
    def clear_epoch(self) -> None:
        self.client.delete("blz:epoch")

    @_storage_errors
    def drop_all_but(self, keep: frozenset[str]) -> int:
        """Release every pending blob of every supercuboid not in ``keep`` (a Redis that came
        back short: they are older than what the base tier has). Returns how many."""
        dropped = 0
        for name in self.pending_names():
            if name not in keep:
                seqs: list[bytes] = self.client.zrange(f"blz:sc:{name}", 0, -1)  # type: ignore[assignment]
                dropped += self.release(name, [int(s) for s in seqs])
        return dropped

    def _first_seq(self, name: str) -> int | None:
        first: list[bytes] = self.client.zrange(f"blz:sc:{name}", 0, 0)  # type: ignore[assignment]
        return int(first[0]) if first else None


class RedisMergeRequests:
    """Merge rounds asked for now (`POST /v1/blaze/merge/`, `ndstore blaze merge`), and how each went."""

    def __init__(self, client: redis.Redis):
        self.client = client

    @_storage_errors
    def request_merge(self) -> str:
        """Ask the merger daemon for a round now; returns the request's id for merge_status."""
        request_id = secrets.token_hex(6)
        self.set_merge_status(request_id, {"state": "queued", "requested_at": time.time()})
        self.client.rpush("blz:merge:requests", json.dumps({"id": request_id}))
        return request_id

    @_storage_errors
    def take_merge_requests(self) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=True)
        pipe.lrange("blz:merge:requests", 0, -1)
        pipe.delete("blz:merge:requests")
        return [json.loads(r) for r in pipe.execute()[0]]

    @_storage_errors
    def set_merge_status(self, request_id: str, status: dict[str, Any]) -> None:
        self.client.hset("blz:merge:status", request_id, json.dumps(status))

    @_storage_errors
    def merge_status(self, request_id: str) -> dict[str, Any] | None:
        raw = self.client.hget("blz:merge:status", request_id)
        return json.loads(raw) if raw else None


class RedisMergerPresence:
    """The live merger announces itself; the key expires without heartbeats."""

    def __init__(self, client: redis.Redis):
        self.client = client

    @_storage_errors
    def announce_merger(self, info: dict[str, Any], ttl_s: float) -> None:
        """A running merger says so; the key expires `ttl_s` after its last beat."""
        self.client.set("blz:merger", json.dumps(info), px=max(1, int(ttl_s * 1000)))

    @_storage_errors
    def retire_merger(self) -> None:
        self.client.delete("blz:merger")

    @_storage_errors
    def merger(self) -> dict[str, Any] | None:
        """The live merger's announcement (master, since, last_beat), or None when none beats."""
        raw = self.client.get("blz:merger")
        return json.loads(raw) if raw else None
