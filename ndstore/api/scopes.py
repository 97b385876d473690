"""What a scoped token may reach: at most its level (read or write), only inside its resource
(a collection, an experiment or a channel and what lies below it; none: all the user's), never
as staff or superuser, and not past its expiry (docs/design/scoped-tokens.md).

The scope rides on the request's user. The user a token names is cached per process and shared
by every request (meta_cache.py), so it is never changed: for a scoped token, authentication
answers `scoped_user(...)`, a per-request shallow copy whose is_staff and is_superuser are False
and whose `token_scope` is the token's Scope. Every check that reads those flags is then closed
to a scoped token without knowing of scopes, and auth.access_level caps what it computes by the
scope's level and resource."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, NoReturn

from django.db.models import Q

from ndstore.api.models import ApiToken, Channel, Collection, Experiment, Grant

READ, WRITE = 1, 2  # as auth.READ, auth.WRITE (auth imports this module)


@dataclass(frozen=True)
class Scope:
    token_id: int
    level: int  # the most the token may do: READ or WRITE
    collection_id: int | None
    experiment_id: int | None
    channel_id: int | None
    path: str  # "collection/experiment/channel", as far as the scope goes; "" for all the user's
    superuser: bool  # the user's own standing, which `level` caps

    def covers(self, collection: Collection, experiment: Experiment | None = None,
               channel: Channel | None = None) -> bool:
        """Whether the resource lies inside the scope (the scope's resource or below it)."""
        return ((self.collection_id is None or collection.pk == self.collection_id)
                and (self.experiment_id is None or (experiment is not None and experiment.pk == self.experiment_id))
                and (self.channel_id is None or (channel is not None and channel.pk == self.channel_id)))

    def grants(self) -> Q:
        """The grants that bear on something inside the scope: on its resource, above it or below it."""
        where = Q() if self.collection_id is None else Q(collection_id=self.collection_id)
        if self.experiment_id is not None:
            where &= Q(experiment__isnull=True) | Q(experiment_id=self.experiment_id)
        if self.channel_id is not None:
            where &= Q(channel__isnull=True) | Q(channel_id=self.channel_id)
        return where

    def channels(self, prefix: str = "") -> Q:
        """The channels inside the scope, as a filter on Channel (`prefix`: the path to a channel)."""
        where = Q()
        if self.channel_id is not None:
            where &= Q(**{f"{prefix}pk": self.channel_id})
        if self.experiment_id is not None:
            where &= Q(**{f"{prefix}experiment_id": self.experiment_id})
        if self.collection_id is not None:
            where &= Q(**{f"{prefix}experiment__collection_id": self.collection_id})
        return where

    def experiments(self) -> Q:
        """The experiments inside the scope, as a filter on Experiment (none inside a channel)."""
        if self.channel_id is not None:
            return Q(pk__in=[])
        if self.experiment_id is not None:
            return Q(pk=self.experiment_id)
        return Q(collection_id=self.collection_id) if self.collection_id is not None else Q()

    def contains(self, collection: Collection | None, experiment: Experiment | None,
                 channel: Channel | None) -> bool:
        """Whether a scope on this resource (None: all the user's) would lie inside this one."""
        if collection is None:
            return self.collection_id is None
        return self.covers(collection, experiment, channel)


def of(user: Any) -> Scope | None:
    """The scope of the token the user came with; None for an unscoped token (or none)."""
    return getattr(user, "token_scope", None)


def path_of(token: ApiToken) -> str:
    return "/".join(r.name for r in (token.collection, token.experiment, token.channel) if r is not None)


def scope_of(token: ApiToken) -> Scope | None:
    if not token.level:
        return None
    return Scope(token_id=token.pk, level=Grant.LEVELS[token.level], collection_id=token.collection_id,
                 experiment_id=token.experiment_id, channel_id=token.channel_id, path=path_of(token),
                 superuser=token.user.is_superuser)


def _unsaveable(*_: Any, **__: Any) -> NoReturn:
    raise RuntimeError("a scoped token's view of its user is not saved: it would drop the user's staff flags")


def scoped_user(user: Any, token: ApiToken) -> Any:
    """The user as the request sees it: itself for an unscoped token; for a scoped one a
    per-request copy that is neither staff nor superuser and carries the scope."""
    scope = scope_of(token)
    if scope is None:
        return user
    view = copy.copy(user)
    view.is_staff = view.is_superuser = False
    view.token_scope = scope
    view.save = _unsaveable
    return view
