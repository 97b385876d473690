"""`django-admin ndstore_segmentation coll/exp/chan [--master URL]`: rebuild every mesh and
skeleton of a label channel on Spark in this process (what `ndstore segmentation --engine spark`
runs)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ndstore.api import lookups
from ndstore.engine.segments.spark_build import build_products
from ndstore.engine.segments.upkeep import affected
from ndstore.engine.spark import spark_session
from ndstore.wiring import products_for, services


class Command(BaseCommand):
    help = "Rebuild the segmentation products (meshes, skeletons) of a label channel on Spark."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("channel", help="collection/experiment/channel")
        parser.add_argument("--master", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        names = options["channel"].split("/")
        if len(names) != 3:
            raise CommandError(f"channel must be collection/experiment/channel, not {options['channel']!r}")
        _, _, chan = lookups.channel_path(*names)
        if chan.type != "annotation":
            raise CommandError(f"{options['channel']} is an image channel: products are made of label channels")
        products = services().products
        if products is None:
            raise CommandError("segmentation products need the label index (NDSTORE_LABEL_BACKEND)")
        spec = lookups.product_spec(chan)
        products.describe(spec)
        t = chan.default_time_sample
        keys = affected(spec, services().index.mortons(spec.channel.volume_key(0, t)), t)
        spark = spark_session(options["master"] or services().config.spark_master, "ndstore-segmentation")
        try:
            result = build_products(spark, keys, partial(products_for, services().config))
        finally:
            spark.stop()
        self.stdout.write(json.dumps(result, indent=1))
        if result["state"] == "FAILED":
            raise CommandError("some supercuboids failed; see the failures above")
