"""ObjectStore over any S3-compatible endpoint (AWS, MinIO, moto's server) with boto3.

An object is read in ranged GETs of at most a part (``part_bytes``, NDSTORE_S3_PART_BYTES), all
at once: S3 serves each connection at a fraction of what it serves a client over several
(docs/design/serving.md, "Direct I/O and S3 objects in parts"). An object larger than ``multipart_threshold``
(NDSTORE_S3_MULTIPART_THRESHOLD; 0, the default: none) is uploaded in parts sent at once. S3
bills each part and the upload's start and end as a PUT: a 14 MiB supercuboid in two parts costs
four PUTs instead of one, and a large write stores many objects at once anyway.

boto3 checks a GET's CRC32 only when the GET is of the whole object, so every object carries the
CRC32 of its whole body in its metadata (``x-amz-meta-ndstore-crc32``) and a read in parts checks
the bytes it joined against it. The parts after the first two are asked for with ``If-Match`` of
the first one's ETag (the second must carry the same ETag): an object replaced half way through
a read is read again, never spliced from two versions. An object without that metadata (written
before it existed, or by another tool) is read again in one whole GET, which boto3 checks, unless
its first part was all of it and came with S3's own CRC32.
"""

from __future__ import annotations

import base64
import math
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ndstore.core.errors import StorageError
from ndstore.core.parallel import map_completed, run_all
from ndstore.storage.aws import MISSING, Credentials, aws_call, aws_client

_DELETE_BATCH = 1000
DEFAULT_PART_BYTES = 8 << 20  # s3transfer's default part, and AWS's advice for ranged GETs
CRC32_META = "ndstore-crc32"  # S3 sends user metadata back with every GET, ranged ones included
_READ_ATTEMPTS = 3  # a read whose object changed under it, or whose bytes fail their check
# S3's largest single PUT; nothing the service stores comes near it (a supercuboid of uint64 is
# 128 MiB raw). A larger size in a Content-Range is not believed (it would plan that many parts).
_LARGEST_OBJECT = 5 << 30
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)$")


class _ReadAgain(Exception):
    """The object changed between the parts of a read, or the joined bytes fail their CRC32."""


def _s3_crc32(crc: int) -> str:
    """S3's form of a CRC32: big-endian, base64."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


class S3ObjectStore:
    def __init__(self, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1", parallelism: int = 16,
                 timeout_s: float | None = None, credentials: Credentials | None = None,
                 part_bytes: int = DEFAULT_PART_BYTES, multipart_threshold: int = 0):
        self.bucket = bucket
        self.part_bytes = part_bytes  # 0: whole objects; else >= 5 MiB (S3's smallest part but the last)
        self.multipart_threshold = multipart_threshold  # 0: never
        # one connection for each object request and each part request that may run at once
        self._s3 = aws_client("s3", endpoint_url, region, 2 * parallelism, timeout_s, credentials)
        self._pool = ThreadPoolExecutor(parallelism, thread_name_prefix="s3")
        # parts get threads of their own: an object's task waits on its parts, which must never
        # wait for a thread that such a task holds
        self._parts = ThreadPoolExecutor(parallelism, thread_name_prefix="s3-part")

    def ensure_ready(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            try:  # another worker starting at the same moment may create it first
                self._s3.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise StorageError(f"S3 create_bucket {self.bucket} failed: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"S3 create_bucket {self.bucket} failed: {exc}") from exc

    def get_many(self, keys: Sequence[str], window: int | None = None) -> Iterator[tuple[str, bytes | None]]:
        return map_completed(self._pool, self._get, keys, window)

    def put_many(self, items: Mapping[str, bytes]) -> None:
        run_all(self._pool, lambda k: self._put(k, items[k]), items)

    def delete_many(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[i : i + _DELETE_BATCH]]
            reply = self._call(self._s3.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if reply.get("Errors"):
                raise StorageError(f"S3 refused to delete {len(reply['Errors'])} objects: {reply['Errors'][0]}")

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Every key under ``prefix`` (for tests and tools; never on the read path)."""
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield item["Key"]

    # -- writes ------------------------------------------------------------------------------------

    def _put(self, key: str, body: bytes) -> None:
        """One PUT, or (above the threshold) a multipart upload of parts sent at once; either way
        the object appears whole or not at all, with the CRC32 of its body in its metadata."""
        crc = zlib.crc32(body)
        metadata = {CRC32_META: f"{crc:08x}"}
        if not self.multipart_threshold or len(body) <= max(self.multipart_threshold, self.part_bytes):
            # boto3 sends the CRC32 given, not its own
            self._call(self._s3.put_object, Bucket=self.bucket, Key=key, Body=body, Metadata=metadata,
                       ChecksumCRC32=_s3_crc32(crc))
            return
        upload = self._call(self._s3.create_multipart_upload, Bucket=self.bucket, Key=key, Metadata=metadata,
                            ChecksumAlgorithm="CRC32")["UploadId"]
        view = memoryview(body)
        starts = range(0, len(body), self.part_bytes)

        def send(start: int) -> dict[str, Any]:
            part = bytes(view[start:start + self.part_bytes])  # boto3 takes no memoryview
            number = start // self.part_bytes + 1
            crc = _s3_crc32(zlib.crc32(part))
            reply = self._call(self._s3.upload_part, Bucket=self.bucket, Key=key, UploadId=upload,
                               PartNumber=number, Body=part, ChecksumCRC32=crc)
            return {"PartNumber": number, "ETag": reply["ETag"], "ChecksumCRC32": crc}

        try:  # map_completed returns only once no part is still being sent
            parts = sorted((p for _, p in map_completed(self._parts, send, starts)), key=lambda p: p["PartNumber"])
            self._call(self._s3.complete_multipart_upload, Bucket=self.bucket, Key=key, UploadId=upload,
                       MultipartUpload={"Parts": parts})
        except BaseException:
            try:  # S3 would keep (and bill) the parts sent until told to drop them
                self._s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            except (BotoCoreError, ClientError):
                pass  # a bucket lifecycle rule for incomplete uploads collects what is left
            raise

    # -- reads -------------------------------------------------------------------------------------

    def _get(self, key: str) -> bytes | None:
        failure = ""
        for _ in range(_READ_ATTEMPTS):
            try:
                return self._read(key)
            except _ReadAgain as exc:
                failure = str(exc)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in MISSING:
                    return None
                raise StorageError(f"S3 GET {key} failed: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageError(f"S3 GET {key} failed: {exc}") from exc
        raise StorageError(f"S3 GET {key} failed: {failure} ({_READ_ATTEMPTS} attempts)")

    def _read(self, key: str) -> bytes:
        """The object in ranged GETs of at most a part: the first two at once (the second on the
        guess that the object is larger than a part: a 416 where it is not), then the rest, in
        parts of equal size, at once."""
        if not self.part_bytes:
            return self._whole(key)
        size = self.part_bytes
        second = self._parts.submit(self._range, key, size, 2 * size - 1, None)
        try:
            first = self._range(key, 0, size - 1, None)
        finally:
            guessed = _outcome(second)
        if first is None:  # an empty object has no byte 0
            return self._whole(key)
        reply, head, total = first
        expected = _labelled_crc32(reply.get("Metadata", {}))
        if expected is None:
            return self._unlabelled(key, reply, head, total)
        if total == len(head):  # all of it (or a server that ignores ranges sent it all)
            if isinstance(guessed, tuple) and total <= size:  # the guess past the end found bytes
                raise _ReadAgain("the object was replaced while it was read")
            return _checked(head, expected)
        if isinstance(guessed, BaseException):
            raise guessed
        if guessed is None or guessed[0]["ETag"] != reply["ETag"]:
            raise _ReadAgain("the object was replaced while it was read")
        pieces = [head, guessed[1]]
        rest = total - min(total, 2 * size)
        if rest:
            step = math.ceil(rest / math.ceil(rest / size))  # the rest in equal parts of at most a part
            starts = range(2 * size, total, step)
            found = dict(map_completed(self._parts, lambda at: self._range(key, at, min(at + step, total) - 1,
                                                                           reply["ETag"]), starts))
            for at in starts:
                piece = found[at]
                if piece is None:
                    raise _ReadAgain("the object was replaced while it was read")
                pieces.append(piece[1])
        return _checked(b"".join(pieces), expected)

    def _range(self, key: str, start: int, end: int, etag: str | None) -> tuple[dict[str, Any], bytes, int] | None:
        """Bytes start..end (fewer at the object's end) with the reply and the object's size; None
        when the object ends before ``start``. With ``etag``: only of that version of the object."""
        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}",
                                        **({"IfMatch": etag} if etag else {}))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidRange":
                return None
            if code in ("PreconditionFailed", "412"):
                raise _ReadAgain("the object was replaced while it was read") from None
            raise
        data = _body(reply)
        return reply, data, _total_size(reply.get("ContentRange"), start, data)

    def _unlabelled(self, key: str, first: dict[str, Any], head: bytes, total: int) -> bytes:
        """An object without a CRC32 in its metadata: its first range is the whole object and
        S3 sent that object's own CRC32 (a single-part object), or it is read again whole."""
        crc = first.get("ChecksumCRC32")
        if total == len(head) and crc and "-" not in crc:
            return _checked(head, int.from_bytes(base64.b64decode(crc), "big"))
        return self._whole(key)

    def _whole(self, key: str) -> bytes:
        """One GET of the whole object; boto3 checks the CRC32 S3 sends with it."""
        return _body(self._s3.get_object(Bucket=self.bucket, Key=key))

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        return aws_call("S3", fn, **kwargs)


def _body(reply: dict[str, Any]) -> bytes:
    body = reply["Body"]
    try:
        return body.read()  # type: ignore[no-any-return]
    finally:
        body.close()


def _labelled_crc32(metadata: dict[str, str]) -> int | None:
    """The CRC32 an object's metadata gives for its body; None if it gives none (or not one of ours)."""
    value = metadata.get(CRC32_META, "")
    return int(value, 16) if re.fullmatch(r"[0-9a-f]{8}", value) else None


def _total_size(content_range: str | None, start: int, data: bytes) -> int:
    """The object's size from a ranged GET's Content-Range, checked against the bytes asked for
    and received; a server that ignored the range (no Content-Range) sent the whole object."""
    if not content_range and start == 0:
        return len(data)
    match = _CONTENT_RANGE.match(content_range or "")
    if match is None or int(match[1]) != start or int(match[2]) + 1 - start != len(data):
        raise _ReadAgain(f"a GET of bytes {start}- answered Content-Range {content_range!r} with {len(data)} bytes")
    if int(match[3]) > _LARGEST_OBJECT:
        raise StorageError(f"S3 claims an object of {int(match[3])} bytes (Content-Range {content_range!r}); "
                           f"nothing stored here is over {_LARGEST_OBJECT}")
    return int(match[3])


def _outcome(future: Future[Any]) -> Any:
    """A finished call's result, or its exception (the caller decides whether it matters)."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - handed back, not swallowed
        return exc


def _checked(data: bytes, expected: int) -> bytes:
    crc = zlib.crc32(data)
    if crc != expected:
        raise _ReadAgain(f"its bytes do not match their CRC32 ({crc:08x}, expected {expected:08x})")
    return data
