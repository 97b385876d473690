"""CuboidCache on Redis: the cuboids of resident supercuboids, the LRU index and the dirty set.

  ndc:{N}      hash: cuboid number -> blosc blob (b"" marks a cuboid known to be all zeros)
  ndc:index    sorted set: N -> last access time (s); which supercuboids are resident
  ndc:dirty    sorted set: N -> time it first became dirty; what the flusher must write back
  ndc:{N}:new  hash: a supercuboid's new cuboids while a put of many is under way (see `put`)
N is a supercuboid's name (its volume partition and Morton code); the braces make it the hash
tag, so on Redis Cluster a supercuboid's cuboids live on one node. Callers hold the
supercuboid's lock; this adapter only stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from ndstore.core.errors import StorageError

INDEX = "ndc:index"
DIRTY = "ndc:dirty"
# Redis appends each write command to its AOF buffer, which grows by at most 1 MiB at a time: a
# 16 MiB HSET of a whole supercuboid is copied over and over (measured: 250 MB/s). Commands of
# 8 cuboids (about 2 MiB) went at about 1 GB/s.
FIELDS_PER_COMMAND = 8
# Start a staging hash empty, or as a copy of the stored one when the new fields do not replace
# all of it. COPY runs in Redis, and the AOF records the command, not the 16 MiB it copies.
_STAGE = """
redis.call('DEL', KEYS[2])
if redis.call('HLEN', KEYS[1]) > tonumber(ARGV[1]) then redis.call('COPY', KEYS[1], KEYS[2]) end
return 1"""


def _hash(name: str) -> str:
    return f"ndc:{{{name}}}"


def _staging(name: str) -> str:
    return f"ndc:{{{name}}}:new"


class RedisCuboidCache:
    def __init__(self, client: redis.Redis):
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._stage = client.register_script(_STAGE)

    def resident(self, names: Sequence[str]) -> list[bool]:
        if not names:
            return []
        scores = self._do(lambda: self._redis.zmscore(INDEX, list(names)))
        return [s is not None for s in scores]

    def get_many(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None]]:
        """HMGET the given cuboid numbers of each supercuboid, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for name, numbers in wanted.items():
            pipe.hmget(_hash(name), [str(n) for n in numbers])
        replies = self._do(pipe.execute)
        return dict(zip(wanted, replies))

    def get_if_resident(self, wanted: Mapping[str, Sequence[int]]) -> dict[str, list[bytes | None] | None]:
        """The given cuboids of each supercuboid that is resident, None for one that is not; one
        round trip for both questions (the write path's, under the supercuboids' write locks)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.zmscore(INDEX, list(wanted))
        asked = [name for name, numbers in wanted.items() if numbers]
        for name in asked:
            pipe.hmget(_hash(name), [str(n) for n in wanted[name]])
        scores, *replies = self._do(pipe.execute)
        blobs = dict(zip(asked, replies))
        return {name: (blobs.get(name, []) if score is not None else None) for name, score in zip(wanted, scores)}

    def get_all(self, name: str, count: int) -> list[bytes | None]:
        return self.get_many({name: range(count)})[name]

    def put(self, name: str, blobs: Mapping[int, bytes], now: float, dirty: bool) -> None:
        """Store cuboid blobs and record the supercuboid resident (and dirty if asked), all or
        nothing: a writer that dies half way (SIGKILL, a lost connection) leaves the old cuboids,
        never some of each. Up to FIELDS_PER_COMMAND blobs go in one HSET; more are written into
        a staging hash (a copy of the stored one unless they replace all of it) at pipeline speed
        and renamed over it. That HSET or RENAME runs in one MULTI with the marks (a MULTI of
        every HSET would be atomic too, but Redis then buffers 16 MiB of AOF at once: 3x slower).
        On a Cluster a MULTI holds one slot's keys: the supercuboid is marked dirty before it
        changes (a writer dying then leaves it unchanged, written back as it is) and resident after."""
        main, items = _hash(name), [(str(n), b) for n, b in blobs.items()]
        staged = len(items) > FIELDS_PER_COMMAND
        if staged:
            self._do(lambda: self._stage(keys=[main, _staging(name)], args=[len(items)]))
            pipe = self._redis.pipeline(transaction=False)
            for i in range(0, len(items), FIELDS_PER_COMMAND):
                pipe.hset(_staging(name), mapping=dict(items[i:i + FIELDS_PER_COMMAND]))
            self._do(pipe.execute)
        if self._cluster:
            if dirty:
                self._do(lambda: self._redis.zadd(DIRTY, {name: now}, nx=True))
            self._do(lambda: self._redis.rename(_staging(name), main) if staged
                     else self._redis.hset(main, mapping=dict(items)))
            self._do(lambda: self._redis.zadd(INDEX, {name: now}))
            return
        commit = self._redis.pipeline(transaction=True)
        if staged:
            commit.rename(_staging(name), main)
        else:
            commit.hset(main, mapping=dict(items))
        commit.zadd(INDEX, {name: now})
        if dirty:
            commit.zadd(DIRTY, {name: now}, nx=True)
        self._do(commit.execute)

    def touch(self, names: Sequence[str], now: float) -> None:
        if names:
            self._do(lambda: self._redis.zadd(INDEX, {n: now for n in names}, xx=True))

    def dirty_before(self, when: float, limit: int) -> list[str]:
        names = self._do(lambda: self._redis.zrangebyscore(DIRTY, "-inf", when, start=0, num=limit))
        return [n.decode() for n in names]

    def is_dirty(self, names: Sequence[str]) -> list[bool]:
        if not names:
            return []
        return [s is not None for s in self._do(lambda: self._redis.zmscore(DIRTY, list(names)))]

    def clear_dirty(self, name: str) -> None:
        self._do(lambda: self._redis.zrem(DIRTY, name))

    def evict(self, name: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(_hash(name))
        pipe.delete(_staging(name))  # what a writer that died half way left staged
        pipe.zrem(INDEX, name)
        pipe.zrem(DIRTY, name)
        self._do(pipe.execute)

    def names_with_prefix(self, prefix: str) -> list[str]:
        """Resident or dirty supercuboids whose names start with ``prefix`` (bulk operations only)."""
        def scan(key: str) -> list[str]:
            return [n.decode() for n, _ in self._redis.zscan_iter(key, match=prefix + "*")]

        return sorted(set(self._do(lambda: scan(INDEX) + scan(DIRTY))))

    def coldest(self, count: int) -> list[str]:
        return [n.decode() for n in self._do(lambda: self._redis.zrange(INDEX, 0, count - 1))]

    def used_memory(self) -> int:
        """Bytes Redis uses; on a Cluster, the most any one node uses (each evicts its own)."""
        info = self._do(lambda: self._redis.info("memory"))
        if "used_memory" in info:
            return int(info["used_memory"])
        return max(int(node["used_memory"]) for node in info.values())

    def count(self) -> tuple[int, int]:
        """(resident, dirty) supercuboid counts."""
        return self._do(lambda: self._redis.zcard(INDEX)), self._do(lambda: self._redis.zcard(DIRTY))

    @staticmethod
    def _do(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except redis.RedisError as exc:
            raise StorageError(f"cache tier unavailable: {exc}") from exc
