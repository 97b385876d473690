"""The `ndstore` command line: what a user runs against a service (ndstore.client.cli) and what
runs the service (ndstore.ops.cli), under one name."""

from __future__ import annotations

import click

from ndstore.client import cli as client_cli
from ndstore.ops import cli as ops_cli


@click.group()
def main() -> None:
    """NDStore: tiered storage for petascale image volumes."""


for _command in (*ops_cli.commands.commands.values(), *client_cli.commands.commands.values()):
    main.add_command(_command)

if __name__ == "__main__":
    main()
