"""`django-admin ndstore_downsample coll/exp/chan [--master URL]`: build a channel's resolution
hierarchy on Spark in this process (what `ndstore downsample --engine spark` runs), recording
the channel's downsample status."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from ndstore.api import levels, lookups
from ndstore.engine.spark import spark_session
from ndstore.engine.spark_downsample import build_hierarchy
from ndstore.wiring import downsampler_for, services


class Command(BaseCommand):
    help = "Build every resolution level of a channel on Spark."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("channel", help="collection/experiment/channel")
        parser.add_argument("--master", default=None)
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["channel"].split("/")
        if len(names) != 3:
            raise CommandError(f"channel must be collection/experiment/channel, not {options['channel']!r}")
        _, _, chan = lookups.channel_path(*names)
        volume = lookups.channel_volume(chan)
        chan.downsample_status = "IN_PROGRESS"
        chan.save(update_fields=["downsample_status"])
        spark = spark_session(options["master"] or services().config.spark_master, "ndstore-downsample")
        bar = tqdm(total=volume.num_levels - 1, desc="levels", unit="level", disable=options["no_progress"])
        try:
            result = build_hierarchy(spark, volume, services().downsampler, partial(downsampler_for, services().config),
                                     on_level=lambda _level, _info: bar.update(1))
        except BaseException:
            chan.downsample_status = "FAILED"
            chan.save(update_fields=["downsample_status"])
            raise
        finally:
            bar.close()
            spark.stop()
        chan.downsample_status = result["state"]
        chan.save(update_fields=["downsample_status"])
        if result["state"] == "DOWNSAMPLED":
            levels.note_hierarchy_built(volume)
        self.stdout.write(json.dumps(result, indent=1))
        if result["state"] == "FAILED":
            raise CommandError("the build failed; see the levels above")
