"""`django-admin mint_token USER`: create the user if needed and print a new API token."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from ndstore.api.models import ApiToken


class Command(BaseCommand):
    help = "Mint an API token for a user (stored hashed; printed once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--staff", action="store_true", help="make the user a resource manager")
        parser.add_argument("--label", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        user, _ = get_user_model().objects.get_or_create(username=options["username"])
        if options["staff"] and not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        _, key = ApiToken.mint(user, label=options["label"])
        self.stdout.write(key)
