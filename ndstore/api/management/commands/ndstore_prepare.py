"""`django-admin ndstore_prepare`: migrate, create the storage, check both Redis servers against
their ledgers (what they lost is refused and said) and the supercuboid index against the object
store (sampled), register annotation channels of an older release in the label index (said until
`ndstore reindex --labels` indexes them), ensure the admin and its token, and load the demo
dataset when NDSTORE_DEMO=1.
Run by `ndstore up` (and the compose and AWS prepare tasks) before the web service."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from ndstore.api import label_channels
from ndstore.api.demo import create_demo
from ndstore.api.models import ApiToken, hash_token
from ndstore.engine import index_check
from ndstore.wiring import Services, services


class Command(BaseCommand):
    help = "Prepare the metadata database, storage, admin token and (optionally) the demo dataset."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        svc = services()  # building the services creates bucket and index
        check_for_loss(svc, self.stderr.write)
        check_index(svc, self.stderr.write)
        label_channels.register_older(self.stderr.write)
        admin = ensure_admin(svc.config.data_dir)
        if os.environ.get("NDSTORE_DEMO") == "1" and create_demo(admin):
            self.stdout.write("demo dataset created: demo/em/image and demo/em/labels")


def check_for_loss(svc: Services, say: Callable[[str], object]) -> None:
    """Both Redis servers checked against their ledgers before anything is served: what they lost
    is refused, and said here."""
    for what, verify in (("cache", svc.cache_tier.loss.verify), ("NDBlaze", svc.blaze_ledger.verify)):
        verdict = verify()
        if verdict is not None:
            say(f"LOSS: {verdict.report(what)}")
    lost = svc.cache_tier.loss.lost()
    if lost:
        say(f"{len(lost)} supercuboids are refused as lost (503): `ndstore recover` lists them and accepts the loss")


def check_index(svc: Services, say: Callable[[str], object]) -> None:
    """A sample of the stored supercuboids looked up in the index: one missing, and listing them
    is refused until `ndstore reindex` (ndstore/engine/index_check.py). An index found damaged by
    the services' build was set aside, marked and said there, in one line."""
    if svc.index.set_aside is not None:
        return
    mark = index_check.stale_mark(svc.objects)
    if mark is None and index_check.check(svc.objects, svc.index).stale:
        mark = index_check.stale_mark(svc.objects)
    if mark is not None:
        say(f"INDEX STALE: {index_check.stale_reason(mark)}; {index_check.REFUSED}")


def ensure_admin(data_dir: Path) -> Any:
    """The superuser `admin` with a token: NDSTORE_ADMIN_TOKEN if set, else one kept in
    <data dir>/admin_token (mode 0600), so the token survives restarts."""
    admin, _ = get_user_model().objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    key = os.environ.get("NDSTORE_ADMIN_TOKEN")
    token_file = data_dir / "admin_token"
    if key is None and token_file.exists():
        key = token_file.read_text().strip()
    if key is None or not ApiToken.objects.filter(key_hash=hash_token(key)).exists():
        _, key = ApiToken.mint(admin, label="admin", key=key)
    if not os.environ.get("NDSTORE_ADMIN_TOKEN"):
        token_file.touch(mode=0o600)
        token_file.write_text(key + "\n")
    return admin
