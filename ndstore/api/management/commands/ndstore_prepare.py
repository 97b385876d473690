"""`django-admin ndstore_prepare`: migrate, create the storage, ensure the admin and its token,
and load the demo dataset when NDSTORE_DEMO=1. Run by `ndstore up` before the web service."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from ndstore.api.demo import create_demo
from ndstore.api.models import ApiToken, hash_token
from ndstore.wiring import services


class Command(BaseCommand):
    help = "Prepare the metadata database, storage, admin token and (optionally) the demo dataset."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        data_dir = services().config.data_dir  # building the services creates bucket and index
        admin = ensure_admin(data_dir)
        if os.environ.get("NDSTORE_DEMO") == "1" and create_demo(admin):
            self.stdout.write("demo dataset created: demo/em/image and demo/em/labels")


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
