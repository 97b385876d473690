"""The first requests of a fresh threaded worker arrive together and share one set of services."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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
