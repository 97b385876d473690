"""Token authentication and per-resource access levels.

A token goes in `Authorization` as `Token <key>` (NDStore's and the Boss's own clients),
`Bearer <key>` (OAuth-style tools), or HTTP Basic with the token as the password and any user
name (CloudVolume's `secrets`, cloudfiles: `{"user": "...", "password": "<key>"}`). The answer to a
missing or refused token still challenges `Token`: a `Basic` challenge would make a browser open
its own login dialog over a viewer's page.

A scoped token (scopes.py) is checked here too: past its expiry it is refused (401 "token
expired", on every request: the cached token row carries its expiry, not a verdict); its level
and resource cap `access_level`; it never acts as staff or superuser."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db.models import Q
from django.utils import timezone
from rest_framework import authentication, exceptions

from ndstore.api import meta_cache, scopes
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
        token = meta_cache.cached(("token", key_hash), lambda: ApiToken.objects.select_related(
            "user", "collection", "experiment", "channel").filter(key_hash=key_hash).first())
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        if token.expires is not None and token.expires <= timezone.now():
            raise exceptions.AuthenticationFailed("token expired")
        return scopes.scoped_user(token.user, token), token

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
    the database, not the metadata cache (inside a change that is not committed yet). A scoped
    token holds min(the user's level, its own) inside its scope and nothing outside it."""
    scope = scopes.of(user)
    if scope is None:
        return _held(user, user.is_authenticated and user.is_superuser, collection, experiment, channel, fresh)
    if not scope.covers(collection, experiment, channel):
        return 0
    return min(scope.level, _held(user, scope.superuser, collection, experiment, channel, fresh))


def _held(user: Any, superuser: bool, collection: Collection, experiment: Experiment | None,
          channel: Channel | None, fresh: bool) -> int:
    if superuser:
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
    scope = scopes.of(user)
    if scope is not None and not scope.covers(collection, experiment, channel):
        raise exceptions.PermissionDenied(f"this token is scoped to {scope.path} and reaches "
                                          f"nothing outside it, such as {path}")
    if scope is not None and scope.level < needed:
        raise exceptions.PermissionDenied(f"this token is limited to {LEVEL_NAMES[scope.level]}; {path} needs "
                                          f"{LEVEL_NAMES[needed]}")
    raise exceptions.PermissionDenied(f"this token lacks {LEVEL_NAMES[needed]} permission on {path}")


def require_some_grant(user: Any, needed: int, action: str) -> None:
    """Before a body that names its target is read: the caller holds `needed` on something (or
    is a superuser). The target itself is checked once the body is parsed."""
    require_login(user, action)
    scope = scopes.of(user)
    if scope is not None and scope.level < needed:
        raise exceptions.PermissionDenied(f"this token is limited to {LEVEL_NAMES[scope.level]}, and to "
                                          f"{action} needs {LEVEL_NAMES[needed]}")
    if scope.superuser if scope is not None else user.is_superuser:
        return
    names = [name for name, level in Grant.LEVELS.items() if level >= needed]
    grants = Grant.objects.filter(user=user, level__in=names)
    if scope is not None:
        grants = grants.filter(scope.grants())
    if not grants.exists():
        raise exceptions.PermissionDenied(f"this token holds {LEVEL_NAMES[needed]} permission on no resource, "
                                          f"which it needs to {action}")


def require_login(user: Any, action: str) -> None:
    if not user.is_authenticated:
        raise exceptions.NotAuthenticated(f"a token is required to {action}")


def require_unscoped(user: Any, action: str) -> None:
    """For what concerns the whole service, not one resource: a scoped token reads only its own."""
    require_login(user, action)
    if scopes.of(user) is not None:
        raise exceptions.PermissionDenied(f"a scoped token may not {action}: it reaches only its own resource")


def require_staff(user: Any, action: str) -> None:
    require_login(user, action)
    if scopes.of(user) is not None:
        raise exceptions.PermissionDenied(f"a scoped token never acts as staff, and only resource managers (staff "
                                          f"users) may {action}")
    if not user.is_staff:
        raise exceptions.PermissionDenied(f"only resource managers (staff users) may {action}")
