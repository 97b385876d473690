"""Domain errors. Raised low, mapped to HTTP status codes once, at the API edge."""

from __future__ import annotations


class NDStoreError(Exception):
    """Base of every error this system raises on purpose."""


class InvalidRequest(NDStoreError):
    """The request is malformed: a bad range, resolution, parameter or body (400)."""


class OutOfBounds(InvalidRequest):
    """A box reaches outside the coordinate frame (400)."""


class InvalidBody(InvalidRequest):
    """A request body cannot be decoded, or does not match the box and datatype (400)."""


class PayloadTooLarge(NDStoreError):
    """A request body or a requested box exceeds the configured cap (413)."""


class UnsupportedMediaType(NDStoreError):
    """A media type this endpoint does not speak (415)."""


class NotAcceptable(NDStoreError):
    """No answer in a media type the request accepts can hold what it asks for (406)."""


class NotFound(NDStoreError):
    """A named resource does not exist (404)."""


class Conflict(NDStoreError):
    """The request conflicts with the current state, e.g. a duplicate name (409)."""


class StorageError(NDStoreError):
    """A storage backend failed in a way the caller may retry (503)."""


class StorageFull(StorageError):
    """The store has no room left (a full disk or quota): nothing was stored (507)."""

    retry_after_s = 30


class LockTimeout(StorageError):
    """A lock could not be acquired in time (503)."""


class BufferFull(StorageError):
    """The NDBlaze write buffer holds as much as it may; the write was not stored (503, with
    Retry-After): retry once the merger has drained it."""

    def __init__(self, message: str, retry_after_s: int = 5):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Busy(NDStoreError):
    """The web worker holds as many bytes of other requests as it may: retry shortly (503 with
    Retry-After). Nothing was read or changed."""

    retry_after_s = 1


class ReadBudgetSpent(NDStoreError):
    """The caller's data GETs have read as many bytes as their budget allows for now (429 with
    Retry-After). Nothing was read."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DataCorrupt(NDStoreError):
    """Stored data cannot be read back as it was written (500): the service refuses to answer
    rather than answer wrong, and nothing is dropped; an operator must look."""


class DamagedInCache(DataCorrupt):
    """A cached cuboid does not match the checksum stored with it: the cache Redis holds damaged
    bytes (a corrupted AOF, a failing disk). Never decoded into an answer."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"the cache holds a damaged copy of supercuboid {name}: {detail}")
        self.name = name


class DataLost(NDStoreError):
    """Writes the service acknowledged to these supercuboids are gone: a Redis lost data it had
    not yet written to the base tier (503). The service refuses them rather than answer with
    older data, until an operator accepts the loss (`ndstore recover`)."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


class RedisUnverified(StorageError):
    """A Redis that holds acknowledged writes answers without the mark of a checked run (it
    restarted without its data, or is another Redis): nothing is stored in it until its holdings
    are checked against its ledger (503)."""

    retry_after_s = 1


class IndexStale(NDStoreError):
    """The supercuboid index misses objects the object store holds (it was lost, restored from an
    older copy, or found damaged and set aside): what lists stored supercuboids (bounding boxes,
    downsampling, deleting a channel) would answer wrong, so it is refused (503) until
    `ndstore reindex` rebuilds it."""


class LabelIndexNotServing(NDStoreError):
    """A segmentation product needs the label index of a channel it does not serve yet (an older
    channel, or an index set aside): 503 until `ndstore reindex --labels` completes it."""

    retry_after_s = 30
