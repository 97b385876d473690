"""The local tile store as the service builds it, and an upload URL read as the service's route
reads it (tests/contracts/test_tile_store.py, tests/storage/test_local_tiles.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ndstore.core.signing import Signer
from ndstore.storage.interfaces import WorkQueue
from ndstore.storage.local_tiles import LocalTileStore

SIGNER = Signer("x" * 32, "tile-upload")
PUBLIC_URL = "http://127.0.0.1:9"


def local_store(root: Path, queues: WorkQueue, clock: Callable[[], float] | None = None) -> LocalTileStore:
    if clock is None:
        return LocalTileStore(root, PUBLIC_URL, SIGNER, queues)
    return LocalTileStore(root, PUBLIC_URL, SIGNER, queues, clock=clock)


def upload_query(url: str) -> tuple[str, str, str, str]:
    """The key, expires, size and signature of a local upload URL, as the service's route reads them."""
    parts = urlsplit(url)
    assert parts.path.startswith("/v1/ingest/tiles/")
    query = parse_qs(parts.query)
    return (unquote(parts.path.removeprefix("/v1/ingest/tiles/")), query["expires"][0], query["size"][0],
            query["signature"][0])


def upload_metadata(headers: dict[str, str]) -> dict[str, str]:
    return {name.removeprefix("x-amz-meta-"): value for name, value in headers.items()}
