"""The `ndstore` commands that run the service or work on its data in place: `up` (the local
stack), `daemons`, `blaze` (merge, merger, status), `runner`, `token`, `recover` (what a Redis
lost), `reindex` (the supercuboid index, or with --labels the label index, rebuilt from the
object store), `downsample` and `segmentation` (through the service's queues, or on Spark against a
stack's data dir)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import click

from ndstore.ops.localstack import LocalStack


def _django(data_dir: Path | None = None) -> None:
    if data_dir is not None:
        os.environ["NDSTORE_DATA_DIR"] = str(data_dir.resolve())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ndstore.api.settings.base")
    import django

    django.setup()


def _stack_env(data_dir: Path | None) -> None:
    """Take the settings of the `ndstore up` running on `data_dir` (its Redis ports, ...), where
    the environment does not say otherwise."""
    import json

    from ndstore.ops.localstack import STACK_ENV

    path = (data_dir or Path(os.environ.get("NDSTORE_DATA_DIR", ".ndstore"))) / STACK_ENV
    if path.exists():
        for name, value in json.loads(path.read_text()).items():
            os.environ.setdefault(name, value)


def _admin_token_file(data_dir: Path) -> Path:
    return data_dir / "admin_token"


@click.group()
def commands() -> None:
    """Commands that run the service."""


@commands.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".ndstore"), show_default=True,
              help="Where every dataset, voxel, and the admin token are kept across restarts.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--workers", default=2, show_default=True, help="gunicorn worker processes")
@click.option("--threads", default=4, show_default=True, help="threads per worker")
@click.option("--demo/--no-demo", default=False, help="Create the demo dataset if it is missing.")
@click.option("--s3-endpoint", default=None, help="Keep supercuboids in S3 at this endpoint instead of the data dir.")
@click.option("--dynamodb-endpoint", default=None, help="Keep the supercuboid index in DynamoDB at this endpoint.")
@click.option("--merger/--no-merger", default=True, show_default=True,
              help="Run the NDBlaze merger (a Spark driver: seconds of CPU to start). Without it NDBlaze writes "
                   "wait in the buffer until a merger runs.")
@click.option("-v", "--verbose", count=True, help="-v: the libraries' logs too; -vv: debug logs.")
def up(data_dir: Path, host: str, port: int, workers: int, threads: int, demo: bool,
       s3_endpoint: str | None, dynamodb_endpoint: str | None, merger: bool, verbose: int) -> None:
    """Run the whole local stack in the foreground until Ctrl-C."""
    extra = {"NDSTORE_DEMO": "1" if demo else "0"}
    if verbose:
        extra.update(NDSTORE_LIBRARY_LOG_LEVEL="INFO" if verbose == 1 else "DEBUG",
                     NDSTORE_LOG_LEVEL="INFO" if verbose == 1 else "DEBUG")
    if s3_endpoint:
        extra.update(NDSTORE_OBJECT_STORE="s3", NDSTORE_S3_ENDPOINT_URL=s3_endpoint)
    if dynamodb_endpoint:
        extra.update(NDSTORE_INDEX="dynamodb", NDSTORE_DYNAMODB_ENDPOINT_URL=dynamodb_endpoint)
    stack = LocalStack(data_dir.resolve(), host, port, workers=workers, threads=threads, extra_env=extra,
                       with_merger=merger)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop during start-up is a clean stop too
    try:
        stack.start()
    except KeyboardInterrupt:
        stack.stop()
        sys.exit(0)
    token = os.environ.get("NDSTORE_ADMIN_TOKEN") or _admin_token_file(stack.data_dir).read_text().strip()
    click.echo(f"\nNDStore is up at {stack.url}  (data in {stack.data_dir})")
    click.echo(f"admin token: {token}")
    merging = f"the NDBlaze merger (Spark, log: {stack.log_dir / 'merger.log'})" if merger else "no NDBlaze merger"
    click.echo("running: nginx + gunicorn (web), 2 redis-servers (cache and locks; NDBlaze), the write-back daemons, "
               f"{merging}, the ingest runner")
    click.echo(f"health: {stack.url}/healthz   metrics (staff token): {stack.url}/metrics")
    if demo:
        click.echo(f"demo: {stack.url}/v1/cutout/demo/em/image/0/0:512/0:512/0:16/")
    click.echo("Ctrl-C stops it.")
    sys.exit(stack.wait())


@commands.command()
@click.option("--bind", default=lambda: os.environ.get("NDSTORE_BIND", "127.0.0.1:8000"), show_default="127.0.0.1:8000",
              help="host:port of the front (nginx); gunicorn listens on a private Unix socket behind it.")
@click.option("--workers", type=int, default=None, show_default="NDSTORE_WEB_WORKERS, else one per core (at least 2)",
              help="gunicorn worker processes")
@click.option("--threads", type=int, default=None, show_default="NDSTORE_WEB_THREADS or 4",
              help="threads per worker")
def serve(bind: str, workers: int | None, threads: int | None) -> None:
    """Run one web node (the image's command): nginx on --bind buffering whole requests and
    responses, gunicorn behind it. Settings come from NDSTORE_*; see docs/deployment.md."""
    from ndstore.ops.front import serve as serve_node

    host, _, port = bind.rpartition(":")
    state = Path(os.environ.get("NDSTORE_DATA_DIR", ".ndstore")) / "front"
    sys.exit(serve_node(host or "0.0.0.0", int(port), workers, threads, state))  # noqa: S104 - as asked


@commands.command()
def daemons() -> None:
    """Run the cache tier's write-back flusher and cache manager until SIGINT/SIGTERM, then
    write back everything still dirty. `ndstore up` runs this; settings come from NDSTORE_*."""
    from ndstore.ops.daemons import run_daemons

    sys.exit(run_daemons())


@commands.group()
def blaze() -> None:
    """The NDBlaze write buffer: merge it, run its merger, see what it holds."""


@blaze.command("merge")
@click.option("--master", default=None, help="Spark master URL (default: NDSTORE_SPARK_MASTER or local[*]).")
def blaze_merge(master: str | None) -> None:
    """Merge every pending write into the base tier now, in this process, and report."""
    import json
    import time

    from ndstore.ops.daemons import merge_now

    started = time.perf_counter()
    result = merge_now(master)
    click.echo(json.dumps({**result.as_dict(), "wall_seconds": round(time.perf_counter() - started, 3)}))


@blaze.command("merger")
def blaze_merger() -> None:
    """Run the merge daemon until SIGINT/SIGTERM (`ndstore up` runs it)."""
    from ndstore.ops.daemons import run_merger

    sys.exit(run_merger())


@blaze.command("status")
def blaze_status() -> None:
    """Print what the buffer holds and the live merger, if any (JSON)."""
    import json

    from ndstore.wiring import services

    svc = services()
    click.echo(json.dumps({"pending": svc.blaze_buffer.stats().as_dict(), "merger": svc.merger_presence.merger()}))


def _channel_job(engine_help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options of a job over a whole channel, run through the service's queues or on Spark."""
    options = [
        click.argument("channel"),
        click.option("--engine", type=click.Choice(["sqs", "spark"]), default="sqs", show_default=True,
                     help=engine_help),
        click.option("--server", default="http://127.0.0.1:8000", show_default=True, help="The service (engine sqs)."),
        click.option("--token", envvar="NDSTORE_TOKEN",
                     help="Token with admin permission on the channel (engine sqs)."),
        click.option("--master", default=None,
                     help="Spark master (engine spark; default NDSTORE_SPARK_MASTER or local[*])."),
        click.option("--data-dir", type=click.Path(path_type=Path), default=None,
                     help="Engine spark: the data dir of a local stack (its metadata and settings)."),
    ]

    def wrap(fn: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return wrap


def _channel_names(channel: str) -> list[str]:
    names = channel.split("/")
    if len(names) != 3:
        raise click.BadParameter(f"CHANNEL must be collection/experiment/channel, not {channel!r}")
    return names


def _on_spark(data_dir: Path | None, command: str, channel: str, **options: object) -> None:
    """Run a channel job's management command here, on Spark, with a local stack's settings."""
    _stack_env(data_dir)
    _django(data_dir)
    from django.core.management import call_command

    call_command(command, channel, **options)


@commands.command()
@_channel_job("sqs: ask the service (its queues and Lambda or local runner); spark: run the build here.")
@click.option("--progress/--no-progress", default=True)
def downsample(channel: str, engine: str, server: str, token: str | None, master: str | None,
               data_dir: Path | None, progress: bool) -> None:
    """Build every resolution level of CHANNEL (collection/experiment/channel) from its base."""
    import json

    names = _channel_names(channel)
    if engine == "spark":
        _on_spark(data_dir, "ndstore_downsample", channel, master=master, no_progress=not progress)
        return
    from ndstore.client.downsample import downsample_through_service

    result = downsample_through_service(server, token, names, progress)
    click.echo(json.dumps(result, indent=1))
    if result["status"] == "FAILED":
        raise click.ClickException("the build failed; see the levels above")


@commands.command()
@_channel_job("sqs: ask the service to queue every rebuild (Lambda or the local runner); spark: run them here.")
def segmentation(channel: str, engine: str, server: str, token: str | None, master: str | None,
                 data_dir: Path | None) -> None:
    """Rebuild every mesh and skeleton of the label CHANNEL (collection/experiment/channel)."""
    import json

    names = _channel_names(channel)
    if engine == "spark":
        _on_spark(data_dir, "ndstore_segmentation", channel, master=master)
        return
    import requests

    r = requests.post(f"{server.rstrip('/')}/v1/segmentation/{'/'.join(names)}/",
                      headers={"Authorization": f"Token {token}"} if token else {}, timeout=60)
    if r.status_code != 202:
        raise click.ClickException(f"{r.status_code}: {r.text[:500]}")
    click.echo(json.dumps(r.json(), indent=1))


@commands.command()
@click.option("--workers", default=None, type=int, help="Worker processes (default: NDSTORE_INGEST_WORKERS or 2).")
def runner(workers: int | None) -> None:
    """Run the ingest pipeline's handlers locally (the stand-in for Lambda) until SIGINT/SIGTERM;
    `ndstore up` runs it."""
    # The runner lives in lambdas/, beside the handlers; the client layer does not import it.
    args = [sys.executable, "-m", "lambdas.runner", *([f"--workers={workers}"] if workers else [])]
    os.execv(sys.executable, args)


@commands.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="The data dir of a local stack (default: NDSTORE_DATA_DIR or ./.ndstore).")
@click.option("--labels", is_flag=True, help="Rebuild the label index of the annotation channels instead.")
def reindex(data_dir: Path | None, labels: bool) -> None:
    """Rebuild the supercuboid index from the object store's self-describing keys (after the
    index was lost or restored from an older copy); bounding boxes, downsampling and deleting
    channels are served again once it is done. With --labels, rebuild the label index of every
    annotation channel from the stored supercuboids (after an upgrade, a crash or a damaged
    index), while the service runs; ids and boundingbox answer from it once it is done."""
    _stack_env(data_dir)
    if labels:
        _django(data_dir)
        from django.core.management import call_command

        call_command("ndstore_reindex_labels")
        return
    if data_dir is not None:
        os.environ["NDSTORE_DATA_DIR"] = str(data_dir.resolve())
    from ndstore.engine.index_check import reindex as rebuild
    from ndstore.wiring import services

    svc = services()
    count = rebuild(svc.objects, svc.index)
    click.echo(f"indexed {count} stored supercuboids; the index is no longer marked stale")


@commands.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="The data dir of a local stack (default: NDSTORE_DATA_DIR or ./.ndstore).")
@click.option("--accept-loss", is_flag=True, help="Serve the lost supercuboids again, as the base tier holds them.")
@click.option("--channel", default=None, help="Only this collection/experiment/channel.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def recover(data_dir: Path | None, accept_loss: bool, channel: str | None, as_json: bool) -> None:
    """List the supercuboids refused because a Redis lost writes it had acknowledged (the cache
    Redis or the NDBlaze buffer came back empty or short), and accept the loss."""
    _stack_env(data_dir)
    _django(data_dir)
    from django.core.management import call_command

    call_command("ndstore_recover", accept_loss=accept_loss, channel=channel, json=as_json)


@commands.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="The data dir of a local stack (default: NDSTORE_DATA_DIR or ./.ndstore).")
@click.option("--user", "username", required=True, help="Create the user if it does not exist.")
@click.option("--staff", is_flag=True, help="Make the user a resource manager (may create collections).")
@click.option("--label", default="", help="A note stored with the token.")
def token(data_dir: Path | None, username: str, staff: bool, label: str) -> None:
    """Mint an API token for a user and print it (it is stored only hashed)."""
    _stack_env(data_dir)  # the stack's own Redis (the metadata generation lives there), not the defaults
    _django(data_dir)
    from django.core.management import call_command

    call_command("mint_token", username, staff=staff, label=label)
