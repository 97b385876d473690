"""`ndstore downsample`: build a channel's resolution hierarchy through the service (its SQS
queues, run by Lambda or the local runner), with a progress bar. The Spark engine runs in the
management command `ndstore_downsample` (it needs the metadata database)."""

from __future__ import annotations

import time
from typing import Any

import requests
from tqdm import tqdm

from ndstore.core.errors import InvalidRequest


def downsample_through_service(server: str, token: str | None, names: list[str], progress: bool,
                               poll_s: float = 1.0) -> dict[str, Any]:
    """POST the build, then follow GET until it is DOWNSAMPLED or FAILED."""
    http = requests.Session()
    if token:
        http.headers["Authorization"] = f"Token {token}"
    url = f"{server.rstrip('/')}/v1/downsample/{'/'.join(names)}/"
    r = http.post(url, timeout=120)
    if r.status_code != 201:
        raise InvalidRequest(f"the service answered {r.status_code} to POST {url}: {r.text}")
    body = r.json()
    with tqdm(desc="parents built", unit="supercuboid", disable=not progress) as bar:
        while body["status"] == "IN_PROGRESS":
            time.sleep(poll_s)
            r = http.get(url, timeout=120)
            r.raise_for_status()
            body = r.json()
            levels = body.get("job", {}).get("levels", {})
            bar.total = sum(v["total"] for v in levels.values())
            bar.update(sum(v["done"] for v in levels.values()) - bar.n)
    return body  # type: ignore[no-any-return]
