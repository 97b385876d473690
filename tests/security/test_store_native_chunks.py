"""The zarr view sends a stored cuboid as its chunk (docs/design/standard-views.md,
"Store-native chunks"), so what the cache holds goes to readers' decoders as it is. An attacker
who may write cannot choose those bytes: every stored cuboid is the server's own compression of
voxels it decoded (a client's blosc frame is never kept as it came), and a blob damaged in the
cache is never sent: its digest is checked and it is read again from the base tier."""

from __future__ import annotations

import blosc
import blosc2
import numpy as np
import redis
from rest_framework.test import APIClient

from ndstore.core.chunks import compress_cuboid
from ndstore.core.synthetic import em_like
from ndstore.wiring import services
from tests.api.conftest import make_dataset

CHUNK = "/zarr/{c}/e1/img8/0/c/0/0/0/0"
CUBOID = (0, 128), (0, 128), (0, 16)  # x, y, z of chunk c/0/0/0/0 of a uint8 channel


def test_a_clients_blosc_frame_is_never_what_readers_are_sent(admin: APIClient) -> None:
    data = make_dataset(admin, name="native1", levels=1)
    voxels = em_like((16, 128, 128), seed=5)
    # the same voxels as a blosc2 frame with options of the client's choosing: typesize 4, zstd,
    # bitshuffle; a reader's c-blosc 1.x could not even open it
    crafted = blosc2.compress(voxels, typesize=4, codec=blosc2.Codec.ZSTD, filter=blosc2.Filter.BITSHUFFLE)
    r = admin.generic("POST", data.cutout("img8", 0, *CUBOID), crafted, content_type="application/blosc")
    assert r.status_code == 201, r.content
    chunk = admin.get(CHUNK.format(c=data.collection))
    assert chunk.status_code == 200
    assert chunk.content != crafted and chunk.content == compress_cuboid(voxels)
    np.testing.assert_array_equal(np.frombuffer(blosc.decompress(chunk.content), np.uint8).reshape(16, 128, 128),
                                  voxels)


def test_a_cuboid_damaged_in_the_cache_is_not_sent(admin: APIClient, service_env: dict[str, str]) -> None:
    data = make_dataset(admin, name="native2", levels=1)
    voxels = em_like((16, 128, 128), seed=6)
    r = admin.generic("POST", data.cutout("img8", 0, *CUBOID), voxels.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    services().plane.cache.upkeep.flush_all()  # the base tier holds it: the damaged copy can be replaced
    client = redis.Redis.from_url(service_env["NDSTORE_REDIS_URL"])
    (key,) = list(client.scan_iter("ndc:{*}"))  # the one supercuboid written (the test's Redis was emptied)
    blob = bytearray(client.hget(key, "0") or b"")
    blob[len(blob) // 2] ^= 0xFF  # its stored digest now disagrees
    client.hset(key, "0", bytes(blob))
    chunk = admin.get(CHUNK.format(c=data.collection))
    assert chunk.status_code == 200 and chunk.content != bytes(blob)
    assert chunk.content == compress_cuboid(voxels)
