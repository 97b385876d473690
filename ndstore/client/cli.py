"""The `ndstore` commands a user runs against a service: `ingest` (the tile-upload client) and
`status`. Nothing here runs the service or touches its stores (that is ndstore.ops)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def commands() -> None:
    """Commands of a service's users."""


def _parse_range(text: str, what: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or not (lo + hi).isascii() or not lo.isdigit() or not hi.isdigit():
        raise click.BadParameter(f"{what} must be start:stop, e.g. 0:512, not {text!r}")
    return int(lo), int(hi)



@commands.command()
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


@commands.command()
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
