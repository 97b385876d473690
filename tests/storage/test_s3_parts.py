"""S3 objects larger than a part: parallel multipart uploads and ranged GETs (ndstore/storage/s3.py),
over real HTTP to moto's server, through the fault proxy where a test needs to see or break the
requests. Every read is checked against the CRC32 the object's metadata carries."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from ndstore.config import Config
from ndstore.core.errors import StorageError
from ndstore.storage.s3 import CRC32_META, S3ObjectStore
from tests.faults.proxy import Call, Fault, FaultProxy

MiB = 1 << 20
PART = 5 * MiB  # the smallest part S3 takes


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_endpoint).start()
    yield p
    p.stop()


@pytest.fixture
def store(proxy: FaultProxy) -> S3ObjectStore:
    s = S3ObjectStore(f"parts-{uuid.uuid4().hex[:12]}", proxy.url, part_bytes=PART, multipart_threshold=PART,
                      timeout_s=5)
    s.ensure_ready()
    return s


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A plain boto3 client straight to moto, beside the store (not through the proxy)."""
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


def of(store: S3ObjectStore, key: str) -> bytes | None:
    [(_, data)] = list(store.get_many([key]))
    return data


def requests_for(proxy: FaultProxy, store: S3ObjectStore, key: str, method: str) -> int:
    """Requests S3 answered with success (200, or 206 with bytes of the object): not the guessed
    part past an object's end (416), nor a fault."""
    return proxy.count(where=lambda s: s.call.method == method and s.call.path.startswith(f"/{store.bucket}/{key}")
                       and s.status in (200, 206))


@pytest.mark.parametrize("size", [1, PART - 1, PART, PART + 1, 3 * PART + 7])
def test_objects_of_every_size_come_back_whole(store: S3ObjectStore, s3: Any, size: int) -> None:
    data = os.urandom(size)
    store.put_many({"k": data})
    assert of(store, "k") == data
    head = s3.head_object(Bucket=store.bucket, Key="k")
    assert head["ContentLength"] == size
    assert head["Metadata"][CRC32_META]  # every object carries the CRC32 of its body
    parts = -(-size // PART)
    assert head["ETag"].endswith(f'-{parts}"') if parts > 1 else "-" not in head["ETag"]


def test_a_large_object_goes_and_comes_back_in_parts(store: S3ObjectStore, proxy: FaultProxy) -> None:
    data = os.urandom(3 * PART + 7)
    store.put_many({"big": data})
    assert requests_for(proxy, store, "big", "PUT") == 4, "a PUT per part"
    assert requests_for(proxy, store, "big", "POST") == 2, "the upload's initiate and complete"
    assert of(store, "big") == data
    # two parts at once (the second on the guess that the object is larger than a part), then
    # the rest (a part and 7 bytes) in two equal halves at once
    assert requests_for(proxy, store, "big", "GET") == 4


def test_by_default_a_large_object_is_one_put_and_comes_back_in_parts(proxy: FaultProxy, s3: Any) -> None:
    store = S3ObjectStore(f"default-{uuid.uuid4().hex[:12]}", proxy.url)
    store.ensure_ready()
    data = os.urandom(20 * MiB)
    store.put_many({"big": data})
    assert requests_for(proxy, store, "big", "PUT") == 1 and requests_for(proxy, store, "big", "POST") == 0
    assert of(store, "big") == data
    assert requests_for(proxy, store, "big", "GET") == 3  # 8 MiB twice at once, then the last 4 MiB
    assert "-" not in s3.head_object(Bucket=store.bucket, Key="big")["ETag"]


def test_without_parts_an_object_is_one_put_and_one_get(proxy: FaultProxy, s3: Any) -> None:
    store = S3ObjectStore(f"whole-{uuid.uuid4().hex[:12]}", proxy.url, part_bytes=0)
    store.ensure_ready()
    data = os.urandom(3 * PART)
    store.put_many({"big": data})
    assert of(store, "big") == data
    assert requests_for(proxy, store, "big", "PUT") == 1 and requests_for(proxy, store, "big", "GET") == 1
    assert s3.head_object(Bucket=store.bucket, Key="big")["Metadata"][CRC32_META]


@pytest.mark.parametrize("size", [100, 3 * PART])
def test_objects_written_without_the_crc32_metadata_are_read_whole_and_checked(
        store: S3ObjectStore, proxy: FaultProxy, s3: Any, size: int) -> None:
    data = os.urandom(size)
    s3.put_object(Bucket=store.bucket, Key="old", Body=data)  # an object from before the metadata
    assert of(store, "old") == data
    # small: its first range is the whole object (the guessed second range found nothing: 416),
    # checked against S3's own CRC32; large: two parts, then read again in one GET, which boto3 checks
    assert requests_for(proxy, store, "old", "GET") == (1 if size < PART else 3)


@pytest.mark.parametrize("size", [100, 3 * PART])
def test_bytes_that_do_not_match_their_crc32_are_an_error_not_data(store: S3ObjectStore, s3: Any, size: int) -> None:
    data = os.urandom(size)
    s3.put_object(Bucket=store.bucket, Key="rotten", Body=data, Metadata={CRC32_META: "0badf00d"})
    with pytest.raises(StorageError, match=r"S3 GET rotten failed: its bytes do not match their CRC32 .*expected "
                                           r"0badf00d.*\(3 attempts\)"):
        of(store, "rotten")


def test_an_object_replaced_during_a_read_is_read_again_never_spliced(
        store: S3ObjectStore, proxy: FaultProxy, s3: Any) -> None:
    old, new = os.urandom(3 * PART), os.urandom(3 * PART)
    store.put_many({"k": old})
    gets = []

    def third_get_of_k(call: Call) -> bool:  # one of the parts asked for once the size is known
        if call.method == "GET" and call.path.startswith(f"/{store.bucket}/k"):
            gets.append(call)
            return len(gets) == 3
        return False

    got: list[bytes | None] = []
    with proxy.faults(Fault("hold", service="s3", match=third_get_of_k)):
        reader = threading.Thread(target=lambda: got.append(of(store, "k")))
        reader.start()
        proxy.wait_held()
        store.put_many({"k": new})  # replaced while the read has two parts and waits for another
    reader.join(60)
    assert got == [new]
    assert proxy.count(where=lambda s: s.status == 412), "the part asked with If-Match of the old ETag is refused"


def test_a_failed_multipart_upload_leaves_the_object_as_it_was_and_no_parts_behind(
        store: S3ObjectStore, proxy: FaultProxy, s3: Any) -> None:
    old = os.urandom(3 * PART)
    store.put_many({"k": old})
    part_two = Fault("500", service="s3", match=lambda c: c.method == "PUT" and "partNumber=2" in c.path)
    with proxy.faults(part_two), pytest.raises(StorageError, match="S3 upload_part failed"):
        store.put_many({"k": os.urandom(3 * PART)})
    assert of(store, "k") == old
    assert not s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads"), "the upload was not aborted"


def test_a_part_that_keeps_failing_fails_the_read(store: S3ObjectStore, proxy: FaultProxy) -> None:
    store.put_many({"k": os.urandom(3 * PART)})
    gets = []

    def parts_after_the_first(call: Call) -> bool:
        if call.method == "GET" and call.path.startswith(f"/{store.bucket}/k"):
            gets.append(call)
            return len(gets) > 1
        return False

    with proxy.faults(Fault("500", service="s3", match=parts_after_the_first)), \
            pytest.raises(StorageError, match="S3 GET k failed"):
        of(store, "k")


@pytest.mark.parametrize("value", ["1000", "-1", "5242879", "8m"])
def test_a_part_size_s3_would_refuse_stops_the_service_at_start(value: str) -> None:
    with pytest.raises(ValueError, match=f"NDSTORE_S3_PART_BYTES='{value}' is not a valid setting"):
        Config.from_env({"NDSTORE_S3_PART_BYTES": value})


def test_part_size_settings() -> None:
    default = Config.from_env({})
    assert (default.s3_part_bytes, default.s3_multipart_threshold) == (8 * MiB, 0)
    assert Config.from_env({"NDSTORE_S3_PART_BYTES": "0"}).s3_part_bytes == 0
    assert Config.from_env({"NDSTORE_S3_PART_BYTES": str(16 * MiB)}).s3_part_bytes == 16 * MiB
    assert Config.from_env({"NDSTORE_S3_MULTIPART_THRESHOLD": str(64 * MiB)}).s3_multipart_threshold == 64 * MiB


@pytest.mark.parametrize(("env", "message"), [
    ({"NDSTORE_S3_MULTIPART_THRESHOLD": "-5"}, "NDSTORE_S3_MULTIPART_THRESHOLD must be 0 .*not -5"),
    ({"NDSTORE_S3_MULTIPART_THRESHOLD": str(64 * MiB), "NDSTORE_S3_PART_BYTES": "0"},
     "NDSTORE_S3_MULTIPART_THRESHOLD needs NDSTORE_S3_PART_BYTES"),
])
def test_a_multipart_threshold_without_parts_stops_the_service_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.from_env(env)


def test_a_small_object_is_one_round_trip_of_two_gets(store: S3ObjectStore, proxy: FaultProxy) -> None:
    store.put_many({"small": b"label" * 1000})
    assert of(store, "small") == b"label" * 1000
    statuses = sorted(s.status for s in proxy.seen
                      if s.call.method == "GET" and s.call.path.startswith(f"/{store.bucket}/small"))
    assert statuses == [206, 416], "the first part, and the guessed second one past the end"


def test_a_content_range_is_believed_only_when_it_matches_what_came() -> None:
    from ndstore.storage import s3 as adapter

    assert adapter._total_size("bytes 0-9/100", 0, b"x" * 10) == 100
    assert adapter._total_size(None, 0, b"x" * 10) == 10  # a server that ignored the range sent it all
    for content_range, start, data in [("bytes 0-9/100", 0, b"x" * 5), ("bytes 10-19/100", 20, b"x" * 10),
                                       (None, 8, b"x" * 10), ("bytes */100", 0, b"")]:
        with pytest.raises(adapter._ReadAgain):
            adapter._total_size(content_range, start, data)
    with pytest.raises(StorageError, match=r"S3 claims an object of 99999999999999 bytes"):
        adapter._total_size("bytes 0-9/99999999999999", 0, b"x" * 10)
