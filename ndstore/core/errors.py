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


class NotFound(NDStoreError):
    """A named resource does not exist (404)."""


class Conflict(NDStoreError):
    """The request conflicts with the current state, e.g. a duplicate name (409)."""


class StorageError(NDStoreError):
    """A storage backend failed in a way the caller may retry (503)."""


class LockTimeout(StorageError):
    """A lock could not be acquired in time (503)."""


class BufferFull(StorageError):
    """The NDBlaze write buffer holds as much as it may; the write was not stored (503, with
    Retry-After): retry once the merger has drained it."""

    def __init__(self, message: str, retry_after_s: int = 5):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DataCorrupt(NDStoreError):
    """Stored data cannot be read back as it was written (500): the service refuses to answer
    rather than answer wrong, and nothing is dropped; an operator must look."""
