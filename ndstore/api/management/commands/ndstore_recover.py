"""`django-admin ndstore_recover`: what a Redis lost (ndstore/engine/ledger.py), by channel, and
the operator's decision to accept it.

Without options it checks both Redis servers against their ledgers (as `ndstore up` does at
start) and lists every supercuboid refused as lost: its channel, resolution, time sample and
Morton code, and why. `--accept-loss` serves them again as the base tier holds them: the writes
lost are gone for good; re-ingest or rewrite those regions if their source still exists.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ndstore.api.models import Channel
from ndstore.core.keys import SupercuboidKey
from ndstore.wiring import services


def channel_names() -> dict[tuple[int, int, int], str]:
    return {(c.experiment.collection_id, c.experiment_id, c.id): f"{c.experiment.collection.name}/"
            f"{c.experiment.name}/{c.name}" for c in Channel.objects.select_related("experiment__collection")}


class Command(BaseCommand):
    help = "List the supercuboids refused because a Redis lost acknowledged writes; --accept-loss serves them again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--accept-loss", action="store_true",
                            help="serve the lost supercuboids again, as the base tier holds them")
        parser.add_argument("--channel", default=None, help="only this collection/experiment/channel")
        parser.add_argument("--json", action="store_true", help="print the list as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        svc = services()
        for what, verify in (("cache", svc.cache_tier.loss.verify), ("NDBlaze", svc.blaze_ledger.verify)):
            verdict = verify()
            if verdict is not None:
                self.stderr.write(verdict.report(what))
        names = channel_names()
        by_channel: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for name, why in sorted(svc.cache_tier.loss.lost().items()):
            key = SupercuboidKey.from_name(name)
            v = key.volume
            channel = names.get((v.collection_id, v.experiment_id, v.channel_id), f"(deleted channel {name})")
            by_channel[channel].append({"supercuboid": name, "resolution": v.resolution, "time": v.time,
                                        "morton": key.morton, "why": why})
        if options["channel"]:
            if options["channel"] not in names.values():
                raise CommandError(f"no channel {options['channel']!r}")
            by_channel = defaultdict(list, {options["channel"]: by_channel.get(options["channel"], [])})
        if options["json"]:
            self.stdout.write(json.dumps(by_channel, indent=1))
        else:
            for channel, entries in sorted(by_channel.items()):
                self.stdout.write(f"{channel}: {len(entries)} supercuboids lost acknowledged writes")
                for e in entries:
                    where = f"resolution {e['resolution']} time {e['time']} morton {e['morton']}"
                    self.stdout.write(f"  {where}: {e['why']}")
            if not any(by_channel.values()):
                self.stdout.write("nothing is refused as lost")
        if options["accept_loss"]:
            chosen = [e["supercuboid"] for entries in by_channel.values() for e in entries]
            svc.cache_tier.loss.accept_loss(chosen)
            self.stdout.write(f"accepted the loss of {len(chosen)} supercuboids: they are served again as the base "
                              "tier holds them")
