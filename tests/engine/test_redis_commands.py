"""How the cache sends cuboids to Redis: commands of at most COMMAND_BYTES of blobs, so a
supercuboid of compressed cuboids (labels, sparse or empty regions) goes in one command and one
transaction, and incompressible ones go 8 to a command as before (docs/design/serving.md,
"Redis commands and replies")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis
import xxhash

from ndstore.core.chunks import compress_cuboid
from ndstore.engine.cache.tier import CacheTier
from ndstore.storage.redis_cache import COMMAND_BYTES, DIRTY, FIELDS_PER_COMMAND, INDEX, _in_batches
from tests.engine.conftest import small_channel

GRID = small_channel("uint8", cid=43).grid(0)
SHAPE = GRID.cuboid[::-1]


def noise(n: int) -> bytes:
    return compress_cuboid(np.random.default_rng(n).integers(0, 256, SHAPE, np.uint8))


def labels(n: int) -> bytes:
    cuboid = np.zeros(SHAPE, np.uint8)
    cuboid[:, 10:40, 10:40] = n + 1
    return compress_cuboid(cuboid)


def sent(batches: list[list[Any]]) -> list[list[int]]:
    """The cuboid numbers of each command, each blob checked against the digest sent beside it."""
    out = []
    for batch in batches:
        quads = [batch[i:i + 4] for i in range(0, len(batch), 4)]
        for number, blob, field, digest in quads:
            assert field == f"#{number}" and digest == xxhash.xxh3_64_digest(blob)
        out.append([int(q[0]) for q in quads])
    return out


def test_incompressible_cuboids_go_eight_to_a_command() -> None:
    blobs = {n: noise(n) for n in range(64)}
    assert all(len(b) > len(noise(0)) - 64 for b in blobs.values())  # blosc stored them as they were
    assert sent(list(_in_batches(blobs))) == [list(range(at, at + FIELDS_PER_COMMAND)) for at in range(0, 64, 8)]


def test_compressed_cuboids_of_a_whole_supercuboid_go_in_one_command() -> None:
    blobs = {-1: b"meta", **{n: labels(n) for n in range(64)}, 7: b""}
    assert sent(list(_in_batches(blobs))) == [[-1, *range(64)]]


def test_a_command_is_cut_before_it_passes_its_bytes_and_holds_at_least_one_cuboid() -> None:
    blobs = {0: b"a" * 100, 1: b"b" * (COMMAND_BYTES - 100), 2: b"c" * 50, 3: b"d" * (COMMAND_BYTES + 5), 4: b""}
    assert sent(list(_in_batches(blobs))) == [[0, 1], [2], [3], [4]]


@pytest.mark.parametrize("kind", ["labels", "noise"])
def test_a_store_of_many_cuboids_lands_whole_staged_only_when_it_needs_more_than_one_command(
        cache_tier: CacheTier, redis_url: str, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    cache = cache_tier._cache  # the tier's own cache adapter, spied on
    staged: list[Any] = []
    real_stage = cache._stage  # type: ignore[attr-defined]
    monkeypatch.setattr(cache, "_stage", lambda **kw: staged.append(kw) or real_stage(**kw))
    make = labels if kind == "labels" else noise
    name = "t-commands-" + kind
    blobs = {n: make(n) for n in range(40)}

    cache.put(name, blobs, 5.0, dirty=True)

    assert len(staged) == (0 if kind == "labels" else 1)
    direct = redis.Redis.from_url(redis_url)
    stored = direct.hgetall(f"ndc:{{{name}}}")
    assert {int(k): v for k, v in stored.items() if not k.startswith(b"#")} == blobs
    assert {k: v for k, v in stored.items() if k.startswith(b"#")} == {
        f"#{n}".encode(): xxhash.xxh3_64_digest(b) for n, b in blobs.items()}
    assert direct.zscore(INDEX, name) == 5.0 and direct.zscore(DIRTY, name) is not None
    assert not direct.exists(f"ndc:{{{name}}}:new")
    assert cache.get_many({name: list(blobs)})[name] == list(blobs.values())  # their digests check
