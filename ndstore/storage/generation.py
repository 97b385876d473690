"""The metadata generation: one Redis counter that every change to resources, grants, tokens or
users advances, so that web workers can keep what they looked up in the metadata database for as
long as the generation they read it under is current.

  ndmeta:gen   integer; created at a random value, so a Redis that lost it (restart without
               persistence, flush) never comes back to a generation an old cached entry carries
"""

from __future__ import annotations

import secrets

import redis

from ndstore.core.errors import StorageError

KEY = "ndmeta:gen"
_BUMP = """
if redis.call('exists', KEYS[1]) == 0 then redis.call('set', KEYS[1], ARGV[1]) end
return redis.call('incr', KEYS[1])
"""


def _random_start() -> int:
    return secrets.randbits(52)  # Lua (the bump script) holds numbers as doubles: exact below 2^53


class RedisGeneration:
    def __init__(self, client: redis.Redis):
        self._redis = client
        self._bump = client.register_script(_BUMP)

    def current(self) -> int:
        try:
            value = self._redis.get(KEY)
            if value is None:
                self._redis.set(KEY, _random_start(), nx=True)
                value = self._redis.get(KEY)
            if value is None:
                raise StorageError("metadata generation vanished as it was created")
        except redis.RedisError as exc:
            raise StorageError(f"metadata generation unavailable: {exc}") from exc
        return int(value)

    def bump(self) -> int:
        try:
            return int(self._bump(keys=[KEY], args=[_random_start()]))
        except redis.RedisError as exc:
            raise StorageError(f"metadata generation unavailable: {exc}") from exc
