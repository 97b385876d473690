"""The `ndstore` command line: `up` runs the local stack, `token` mints API tokens, `blaze`
merges and inspects the NDBlaze buffer."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ndstore.client.localstack import LocalStack


def _django(data_dir: Path | None = None) -> None:
    if data_dir is not None:
        os.environ["NDSTORE_DATA_DIR"] = str(data_dir.resolve())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ndstore.api.settings.base")
    import django

    django.setup()


def _admin_token_file(data_dir: Path) -> Path:
    return data_dir / "admin_token"


@click.group()
def main() -> None:
    """NDStore: tiered storage for petascale image volumes."""


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".ndstore"), show_default=True,
              help="Where every dataset, voxel, and the admin token are kept across restarts.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--workers", default=2, show_default=True, help="gunicorn worker processes")
@click.option("--threads", default=4, show_default=True, help="threads per worker")
@click.option("--demo/--no-demo", default=False, help="Create the demo dataset if it is missing.")
@click.option("--s3-endpoint", default=None, help="Keep supercuboids in S3 at this endpoint instead of the data dir.")
@click.option("--dynamodb-endpoint", default=None, help="Keep the supercuboid index in DynamoDB at this endpoint.")
def up(data_dir: Path, host: str, port: int, workers: int, threads: int, demo: bool,
       s3_endpoint: str | None, dynamodb_endpoint: str | None) -> None:
    """Run the whole local stack in the foreground until Ctrl-C."""
    extra = {"NDSTORE_DEMO": "1" if demo else "0"}
    if s3_endpoint:
        extra.update(NDSTORE_OBJECT_STORE="s3", NDSTORE_S3_ENDPOINT_URL=s3_endpoint)
    if dynamodb_endpoint:
        extra.update(NDSTORE_INDEX="dynamodb", NDSTORE_DYNAMODB_ENDPOINT_URL=dynamodb_endpoint)
    stack = LocalStack(data_dir.resolve(), host, port, workers=workers, threads=threads, extra_env=extra)
    stack.start()
    token = os.environ.get("NDSTORE_ADMIN_TOKEN") or _admin_token_file(stack.data_dir).read_text().strip()
    click.echo(f"\nNDStore is up at {stack.url}  (data in {stack.data_dir})")
    click.echo(f"admin token: {token}")
    if demo:
        click.echo(f"demo: {stack.url}/v1/cutout/demo/em/image/0/0:512/0:512/0:16/")
    click.echo("Ctrl-C stops it.")
    sys.exit(stack.wait())


@main.command()
def daemons() -> None:
    """Run the cache tier's write-back flusher and cache manager until SIGINT/SIGTERM, then
    write back everything still dirty. `ndstore up` runs this; settings come from NDSTORE_*."""
    from ndstore.client.daemons import run_daemons

    sys.exit(run_daemons())


@main.group()
def blaze() -> None:
    """The NDBlaze write buffer: merge it, run its merger, see what it holds."""


@blaze.command("merge")
@click.option("--master", default=None, help="Spark master URL (default: NDSTORE_SPARK_MASTER or local[*]).")
def blaze_merge(master: str | None) -> None:
    """Merge every pending write into the base tier now, in this process, and report."""
    import json
    import time

    from ndstore.client.daemons import merge_now

    started = time.perf_counter()
    result = merge_now(master)
    click.echo(json.dumps({**result.as_dict(), "wall_seconds": round(time.perf_counter() - started, 3)}))


@blaze.command("merger")
def blaze_merger() -> None:
    """Run the merge daemon until SIGINT/SIGTERM (`ndstore up` runs it)."""
    from ndstore.client.daemons import run_merger

    sys.exit(run_merger())


@blaze.command("status")
def blaze_status() -> None:
    """Print what the buffer holds (JSON)."""
    import json

    from ndstore.wiring import services

    click.echo(json.dumps(services().blaze_buffer.stats().as_dict()))


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="The data dir of a local stack (default: NDSTORE_DATA_DIR or ./.ndstore).")
@click.option("--user", "username", required=True, help="Create the user if it does not exist.")
@click.option("--staff", is_flag=True, help="Make the user a resource manager (may create collections).")
@click.option("--label", default="", help="A note stored with the token.")
def token(data_dir: Path | None, username: str, staff: bool, label: str) -> None:
    """Mint an API token for a user and print it (it is stored only hashed)."""
    _django(data_dir)
    from django.core.management import call_command

    call_command("mint_token", username, staff=staff, label=label)


if __name__ == "__main__":
    main()
