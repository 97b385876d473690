"""`django-admin ndstore_reindex_labels` (`ndstore reindex --labels`): the label index of every
annotation channel rebuilt from the stored supercuboids while the service runs, then served
(ndstore/engine/label_index.py `rebuild`). The metadata database says which channels hold
labels; the engine below cannot read it, so the list is made here."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ndstore.api.label_channels import annotation_prefixes
from ndstore.engine.label_index import rebuild
from ndstore.wiring import services


class Command(BaseCommand):
    help = "Rebuild the label index of every annotation channel from the object store."

    def handle(self, *args: Any, **options: Any) -> None:
        svc = services()
        if svc.labels is None:
            raise CommandError("the label index is off (NDSTORE_LABEL_INDEX=off): nothing to rebuild")
        prefixes = annotation_prefixes()
        if not prefixes:
            self.stdout.write("no annotation channels: nothing to index")
            return
        if (waiting := [p for p in prefixes if not svc.labels.serves(p)]):
            self.stdout.write(f"{len(waiting)} annotation channels are not indexed yet: waiting "
                              f"{svc.labels.unknown_ttl_s:.0f} s for every process to index their writes")
        done = rebuild(svc.labels, svc.objects, svc.locks, prefixes)
        self.stdout.write(f"label index rebuilt: {len(prefixes)} annotation channels, {done.supercuboids} "
                          f"supercuboids counted ({done.dense} with too many labels to record: read as voxels); "
                          "ids and boundingbox answer from it")
