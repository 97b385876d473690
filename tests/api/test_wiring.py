"""The first requests of a fresh threaded worker arrive together and share one set of services."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ndstore import wiring


def test_concurrent_first_use_builds_the_services_once() -> None:
    # a new bucket and table (the autouse fixture's names): every thread would try to create them
    wiring.services.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(lambda _: wiring.services(), range(8)))
    assert all(s is built[0] for s in built)
    built[0].index.ensure_ready()  # and once more, with the table there: nothing to do


def test_workers_creating_the_same_table_at_once_all_succeed(moto_endpoint: str) -> None:
    import uuid

    import boto3

    from ndstore.storage.dynamodb import ensure_table

    db = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    table = f"race-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: ensure_table(db, table, [("k", "HASH", "S")]), range(8)))
    assert db.describe_table(TableName=table)["Table"]["TableStatus"] == "ACTIVE"


def test_threads_arriving_while_the_build_ends_build_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window between the build's end and its result being kept: with lru_cache around a lock,
    a thread that took the lock there built a second set of services (seen under pytest-xdist,
    whose I/O thread wants the GIL now and then; here two threads that always want it)."""
    class Built:  # what wiring.services needs of a Services: cache_clear() closes it
        def close(self) -> None:
            pass

    builds: list[Built] = []

    def build(config: object) -> Built:
        time.sleep(0.002)
        builds.append(Built())
        return builds[-1]

    monkeypatch.setattr(wiring, "build", build)
    stop = threading.Event()

    def want_the_gil() -> None:
        while not stop.is_set():
            pass

    hungry = [threading.Thread(target=want_the_gil) for _ in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as they can
    for thread in hungry:
        thread.start()
    try:
        for _ in range(60):
            wiring.services.cache_clear()
            builds.clear()
            with ThreadPoolExecutor(16) as pool:
                seen = list(pool.map(lambda _: wiring.services(), range(64)))
            assert len(builds) == 1 and all(s is builds[0] for s in seen)
    finally:
        stop.set()
        for thread in hungry:
            thread.join()
        sys.setswitchinterval(switch)
        wiring.services.cache_clear()
