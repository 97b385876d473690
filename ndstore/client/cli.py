"""The `ndstore` command line: `up` runs the local stack, `token` mints API tokens, `blaze`
merges and inspects the NDBlaze buffer."""

from __future__ import annotations

import os
import signal
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


def _stack_env(data_dir: Path | None) -> None:
    """Take the settings of the `ndstore up` running on `data_dir` (its Redis ports, ...), where
    the environment does not say otherwise."""
    import json

    from ndstore.client.localstack import STACK_ENV

    path = (data_dir or Path(os.environ.get("NDSTORE_DATA_DIR", ".ndstore"))) / STACK_ENV
    if path.exists():
        for name, value in json.loads(path.read_text()).items():
            os.environ.setdefault(name, value)


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
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop during start-up is a clean stop too
    try:
        stack.start()
    except KeyboardInterrupt:
        stack.stop()
        sys.exit(0)
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
    """Print what the buffer holds and the live merger, if any (JSON)."""
    import json

    from ndstore.wiring import services

    buffer = services().blaze_buffer
    click.echo(json.dumps({"pending": buffer.stats().as_dict(), "merger": buffer.merger()}))


def _parse_range(text: str, what: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit():
        raise click.BadParameter(f"{what} must be start:stop, e.g. 0:512, not {text!r}")
    return int(lo), int(hi)


@main.command()
@click.option("--server", default="http://127.0.0.1:8000", show_default=True, help="The NDStore service.")
@click.option("--token", envvar="NDSTORE_TOKEN", help="API token with write permission (or NDSTORE_TOKEN).")
@click.option("--job", "job_id", type=int, default=None, help="Resume this job instead of creating one.")
@click.option("--channel", default=None, help="collection/experiment/channel to ingest into (new job).")
@click.option("--x", "x_range", default=None, help="x range start:stop of the box (new job).")
@click.option("--y", "y_range", default=None, help="y range start:stop (new job).")
@click.option("--z", "z_range", default=None, help="z range start:stop: one tile per z slice (new job).")
@click.option("--t", "t_range", default="0:1", show_default=True, help="time range (new job).")
@click.option("--tile-size", default="512", show_default=True, help="tile size: N or XxY (new job).")
@click.option("--format", "file_format", default="png", type=click.Choice(["png", "tif", "tiff"]), show_default=True)
@click.option("--tiles", "root", type=click.Path(path_type=Path, file_okay=False), default=Path("."),
              help="The directory the tile pattern is relative to.")
@click.option("--pattern", default="{z:04d}/{y}_{x}.png", show_default=True,
              help="Tile path under --tiles; fields t, z, y, x (tile indices), x0, y0 (first voxel).")
@click.option("--plugin", default=None, help="module:function(TileRef) -> bytes or path, instead of --pattern.")
@click.option("--processes", default=4, show_default=True, help="Parallel uploader processes.")
@click.option("--retry-failed", is_flag=True, help="First requeue the job's failed tasks (after fixing the tiles).")
@click.option("--progress/--no-progress", default=True)
def ingest(server: str, token: str | None, job_id: int | None, channel: str | None, x_range: str | None,
           y_range: str | None, z_range: str | None, t_range: str, tile_size: str, file_format: str, root: Path,
           pattern: str, plugin: str | None, processes: int, retry_failed: bool, progress: bool) -> None:
    """Upload a stack of 2-D tiles into a channel through the ingest pipeline. Safe to kill and
    start again with --job: it resumes where it stopped."""
    from ndstore.client.ingest import IngestClient, TileSource, run_ingest
    from ndstore.core.errors import NDStoreError

    client = IngestClient(server, token)
    try:
        if job_id is None:
            if not (channel and x_range and y_range and z_range):
                raise click.UsageError("a new job needs --channel, --x, --y and --z (or resume one with --job)")
            names = channel.split("/")
            if len(names) != 3:
                raise click.BadParameter(f"--channel must be collection/experiment/channel, not {channel!r}")
            tx, _, ty = tile_size.partition("x")
            fields = dict(zip(("collection", "experiment", "channel"), names))
            for axis, text in (("x", x_range), ("y", y_range), ("z", z_range), ("t", t_range)):
                fields[f"{axis}_start"], fields[f"{axis}_stop"] = _parse_range(text, f"--{axis}")  # type: ignore[assignment]
            fields.update(tile_size_x=int(tx), tile_size_y=int(ty or tx), file_format=file_format)  # type: ignore[arg-type]
            job = client.create(fields)
            click.echo(f"created ingest job {job['id']}; resume with --job {job['id']}")
        else:
            if retry_failed:
                click.echo(f"requeued {client.retry_failed(job_id)} failed tasks")
            job = client.get(job_id)
        summary = run_ingest(client, job, TileSource(root, pattern, plugin), processes, progress, echo=click.echo)
    except NDStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if summary.failed:
        raise click.ClickException(f"{len(summary.failed)} tiles failed (listed above); fix them and run again "
                                   f"with --job {job['id']} --retry-failed")


@main.command()
@click.argument("channel")
@click.option("--engine", type=click.Choice(["sqs", "spark"]), default="sqs", show_default=True,
              help="sqs: ask the service (its queues and Lambda or local runner); spark: run the build here.")
@click.option("--server", default="http://127.0.0.1:8000", show_default=True, help="The service (engine sqs).")
@click.option("--token", envvar="NDSTORE_TOKEN", help="Token with admin permission on the channel (engine sqs).")
@click.option("--master", default=None, help="Spark master (engine spark; default NDSTORE_SPARK_MASTER or local[*]).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Engine spark: the data dir of a local stack (its metadata and settings).")
@click.option("--progress/--no-progress", default=True)
def downsample(channel: str, engine: str, server: str, token: str | None, master: str | None,
               data_dir: Path | None, progress: bool) -> None:
    """Build every resolution level of CHANNEL (collection/experiment/channel) from its base."""
    import json

    names = channel.split("/")
    if len(names) != 3:
        raise click.BadParameter(f"CHANNEL must be collection/experiment/channel, not {channel!r}")
    if engine == "spark":
        _stack_env(data_dir)
        _django(data_dir)
        from django.core.management import call_command

        call_command("ndstore_downsample", channel, master=master, no_progress=not progress)
        return
    from ndstore.client.downsample import downsample_through_service

    result = downsample_through_service(server, token, names, progress)
    click.echo(json.dumps(result, indent=1))
    if result["status"] == "FAILED":
        raise click.ClickException("the build failed; see the levels above")


@main.command()
@click.option("--server", default="http://127.0.0.1:8000", show_default=True, help="The NDStore service.")
@click.option("--token", envvar="NDSTORE_TOKEN", help="API token (or NDSTORE_TOKEN); staff sees the NDBlaze buffer.")
def status(server: str, token: str | None) -> None:
    """What the service holds and is doing (JSON): the collections you may read, the NDBlaze
    buffer and its merger, ingest jobs. Exits non-zero when the service does not answer."""
    import json

    import requests

    http = requests.Session()
    if token:
        http.headers["Authorization"] = f"Token {token}"
    report: dict[str, object] = {"server": server}
    for name, path in (("collections", "v1/collection/"), ("blaze", "v1/blaze/merge/"), ("ingest", "v1/ingest/")):
        try:
            r = http.get(f"{server.rstrip('/')}/{path}", timeout=30)
        except requests.RequestException as exc:
            raise click.ClickException(f"{server} does not answer: {exc}") from exc
        report[name] = r.json() if r.ok else {"status": r.status_code, "message": r.json().get("message", r.text)}
    click.echo(json.dumps(report, indent=1))


@main.command()
@click.option("--workers", default=None, type=int, help="Worker processes (default: NDSTORE_INGEST_WORKERS or 2).")
def runner(workers: int | None) -> None:
    """Run the ingest pipeline's handlers locally (the stand-in for Lambda) until SIGINT/SIGTERM;
    `ndstore up` runs it."""
    # The runner lives in lambdas/, beside the handlers; the client layer does not import it.
    args = [sys.executable, "-m", "lambdas.runner", *([f"--workers={workers}"] if workers else [])]
    os.execv(sys.executable, args)


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
