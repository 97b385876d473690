"""Data migrations, run on a database that holds what the migration meets in a deployment."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("ndstore", "0008_audit_target")]
AFTER = [("ndstore", "0009_channel_written_levels")]


@pytest.mark.django_db(transaction=True)
def test_0009_keeps_every_level_of_existing_channels_advertised() -> None:
    """Channels made before levels were tracked hold unknown data above the base: after the
    migration they advertise every declared level, as before it; a new channel only its base."""
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    frame = old.get_model("ndstore", "CoordinateFrame").objects.create(name="f", x_stop=64, y_stop=64, z_stop=8)
    coll = old.get_model("ndstore", "Collection").objects.create(name="c")
    exps = {levels: old.get_model("ndstore", "Experiment").objects.create(
        collection=coll, name=f"e{levels}", coord_frame=frame, num_hierarchy_levels=levels) for levels in (1, 4)}
    for exp in exps.values():
        old.get_model("ndstore", "Channel").objects.create(experiment=exp, name="img")

    executor = MigrationExecutor(connection)  # reloads the graph: the last run changed what is applied
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    channels = new.get_model("ndstore", "Channel").objects
    assert {c.experiment.num_hierarchy_levels: c.written_levels for c in channels.select_related("experiment")} \
        == {1: 0b1, 4: 0b1111}
    fresh = channels.create(experiment=new.get_model("ndstore", "Experiment").objects.get(name="e4"), name="new")
    assert fresh.written_levels == 0b1

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # back to the latest for the tests that follow
