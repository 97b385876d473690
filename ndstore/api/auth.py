"""Token authentication and per-resource access levels.

A token goes in `Authorization` as `Token <key>` (NDStore's and the Boss's own clients),
`Bearer <key>` (OAuth-style tools), or HTTP Basic with the token as the password and any user
name (CloudVolume's `secrets`, cloudfiles: `{"user": "...", "password": "<key>"}`). The answer to a
missing or refused token still challenges `Token`: a `Basic` challenge would make a browser open
its own login dialog over a viewer's page."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db.models import Q
from rest_framework import authentication, exceptions

from ndstore.api import meta_cache
from ndstore.api.models import ApiToken, Channel, Collection, Experiment, Grant, hash_token

READ, WRITE, ADMIN = 1, 2, 3
LEVEL_NAMES = {READ: "read", WRITE: "write", ADMIN: "admin"}


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        """The token's user, or None when the request carries no token. `request` is DRF's or
        Django's; the answer is kept on Django's (the gate authenticates before DRF does)."""
        django_request = getattr(request, "_request", request)
        known = getattr(django_request, "ndstore_identity", None)
        if known is not None:
            return known  # type: ignore[no-any-return]
        identity = self._lookup(request.META.get("HTTP_AUTHORIZATION", ""))
        django_request.ndstore_identity = identity
        return identity

    @staticmethod
    def _lookup(header: str) -> tuple[Any, ApiToken] | None:
        if not header:
            return None
        key_hash = hash_token(token_key(header))
        token = meta_cache.cached(("token", key_hash),
                                  lambda: ApiToken.objects.select_related("user").filter(key_hash=key_hash).first())
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


SCHEMES = "'Token <key>', 'Bearer <key>', or Basic with the token as the password"


def token_key(header: str) -> str:
    """The token an Authorization header carries; AuthenticationFailed naming the accepted
    forms when it carries none."""
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() in ("token", "bearer") and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            user_and_password = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise exceptions.AuthenticationFailed(f"Basic credentials are not base64 of 'user:password'; "
                                                  f"the Authorization header must be {SCHEMES}") from None
        _, colon, password = user_and_password.partition(":")
        if colon and password:
            return password
        raise exceptions.AuthenticationFailed("Basic credentials carry no password: the token is the password "
                                              "(any user name)")
    raise exceptions.AuthenticationFailed(f"Authorization header must be {SCHEMES}")


def access_level(user: Any, collection: Collection, experiment: Experiment | None = None,
                 channel: Channel | None = None, fresh: bool = False) -> int:
    """The highest level ``user`` holds on the resource: grants on a collection cover its
    experiments and channels, grants on an experiment cover its channels. ``fresh``: read from
    the database, not the metadata cache (inside a change that is not committed yet)."""
    if user.is_authenticated and user.is_superuser:
        return ADMIN
    level = READ if collection.public else 0
    if not user.is_authenticated:
        return level
    def granted() -> int:
        scope = Q(experiment__isnull=True) | (Q(experiment=experiment) if experiment else Q(pk__in=[]))
        chan = Q(channel__isnull=True) | (Q(channel=channel) if channel else Q(pk__in=[]))
        grants = Grant.objects.filter(Q(user=user, collection=collection) & scope & chan)
        return max((Grant.LEVELS[name] for name in grants.values_list("level", flat=True)), default=0)

    if fresh:
        return max(level, granted())
    key = ("level", user.pk, collection.pk, experiment.pk if experiment else None, channel.pk if channel else None)
    return max(level, meta_cache.cached(key, granted))


def require(user: Any, needed: int, collection: Collection, experiment: Experiment | None = None,
            channel: Channel | None = None) -> None:
    if access_level(user, collection, experiment, channel) >= needed:
        return
    path = "/".join(r.name for r in (collection, experiment, channel) if r is not None)
    if isinstance(user, AnonymousUser) or not user.is_authenticated:
        raise exceptions.NotAuthenticated(f"a token with {LEVEL_NAMES[needed]} permission on {path} is required")
    raise exceptions.PermissionDenied(f"this token lacks {LEVEL_NAMES[needed]} permission on {path}")


def require_some_grant(user: Any, needed: int, action: str) -> None:
    """Before a body that names its target is read: the caller holds `needed` on something (or
    is a superuser). The target itself is checked once the body is parsed."""
    require_login(user, action)
    if user.is_superuser:
        return
    names = [name for name, level in Grant.LEVELS.items() if level >= needed]
    if not Grant.objects.filter(user=user, level__in=names).exists():
        raise exceptions.PermissionDenied(f"this token holds {LEVEL_NAMES[needed]} permission on no resource, "
                                          f"which it needs to {action}")


def require_login(user: Any, action: str) -> None:
    if not user.is_authenticated:
        raise exceptions.NotAuthenticated(f"a token is required to {action}")


def require_staff(user: Any, action: str) -> None:
    require_login(user, action)
    if not user.is_staff:
        raise exceptions.PermissionDenied(f"only resource managers (staff users) may {action}")
