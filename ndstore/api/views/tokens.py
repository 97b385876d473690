"""`/v1/tokens/`: a user mints, lists and revokes their own scoped tokens (ndstore/api/scopes.py),
and asks for share links: a read-only token in the fragment of a `/share/` URL (views/share.py).

What a token may mint: a scoped token only tokens inside its own scope, at most its level, and
expiring no later than itself (its minted tokens go when it goes: ApiToken.parent); an unscoped
one any scope on which its user holds the level asked for. A scoped token sees and revokes only
itself and what it minted; an unscoped one all its user's tokens. Another's token is a 404."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups, scopes
from ndstore.api.models import NAME_PATTERN, ApiToken, Channel, Collection, Experiment, Grant
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.api.views.share import share_url
from ndstore.core.errors import Conflict, InvalidRequest, NotFound

MAX_EXPIRES_IN_S = 366 * 24 * 3600
MAX_LIVE_TOKENS = 1000  # per user: a leaked scoped token cannot fill the table
PATH = rf"\A{NAME_PATTERN}(/{NAME_PATTERN}){{0,2}}\Z"


class MintSerializer(serializers.Serializer):
    label = serializers.CharField(max_length=128, required=False, allow_blank=True, default="")
    scope = serializers.RegexField(PATH, max_length=200, required=False,
                                   help_text="collection[/experiment[/channel]]; none: all the user's resources")
    level = serializers.ChoiceField(choices=ApiToken.SCOPED_LEVELS)
    expires_in = serializers.IntegerField(min_value=1, max_value=MAX_EXPIRES_IN_S, help_text="seconds")
    share = serializers.BooleanField(required=False, default=False,
                                     help_text="answer a share_url too (read-only tokens on a resource)")
    view = serializers.RegexField(PATH, max_length=200, required=False,
                                  help_text="the channel the share link shows, inside the scope; default: the "
                                            "scope's channel")


Resources = tuple[Collection | None, Experiment | None, Channel | None]


def _resources(path: str | None) -> Resources:
    if path is None:
        return None, None, None
    names = path.split("/")
    coll = lookups.collection(names[0])
    exp = lookups.experiment(coll, names[1]) if len(names) > 1 else None
    chan = lookups.channel(exp, names[2]) if exp is not None and len(names) > 2 else None
    return coll, exp, chan


def _may_mint(user: Any, caller: ApiToken, where: Resources, level: int, expires: datetime) -> None:
    """PermissionDenied unless the caller may mint a token of this scope, level and expiry."""
    scope = scopes.of(user)
    coll, exp, chan = where
    if scope is not None and not scope.contains(coll, exp, chan):
        raise exceptions.PermissionDenied(f"this token is scoped to {scope.path or 'its user'}: it may mint tokens "
                                          "inside that scope only")
    if scope is not None and scope.level < level:
        raise exceptions.PermissionDenied(f"this token is limited to {auth.LEVEL_NAMES[scope.level]}: it may not "
                                          f"mint a {auth.LEVEL_NAMES[level]} token")
    if caller.expires is not None and expires > caller.expires:
        raise exceptions.PermissionDenied(f"this token expires at {caller.expires.isoformat()}: it may not mint one "
                                          "that outlives it")
    if coll is not None:
        auth.require(user, level, coll, exp, chan)


def _described(token: ApiToken, caller: ApiToken | None) -> dict[str, Any]:
    return {"id": token.pk, "label": token.label, "scope": scopes.path_of(token) if token.level else None,
            "level": token.level or None, "created": token.created.isoformat(),
            "expires": token.expires.isoformat() if token.expires else None,
            "expired": token.expires is not None and token.expires <= timezone.now(),
            "current": caller is not None and token.pk == caller.pk}


def visible(user: Any) -> list[ApiToken]:
    """The tokens the caller sees: all its user's, or a scoped token's own and what it minted."""
    mine = ApiToken.objects.filter(user=user).select_related("collection", "experiment", "channel").order_by("id")
    scope = scopes.of(user)
    if scope is None:
        return list(mine)
    parents = dict(ApiToken.objects.filter(user=user).values_list("id", "parent_id"))
    seen = {scope.token_id}
    while True:  # what it minted, and what those minted
        more = {pk for pk, parent in parents.items() if parent in seen and pk not in seen}
        if not more:
            break
        seen |= more
    return list(mine.filter(pk__in=seen))


def _shown_channel(where: Resources, level: str, view: str | None) -> Channel:
    """The channel a share link of this scope shows: the scope's, or `view` inside it."""
    coll, exp, chan = where
    if level != "read" or coll is None:
        raise InvalidRequest("a share link is a read-only token on a collection, experiment or channel: "
                             "level must be read and scope given")
    if view is None and chan is None:
        raise InvalidRequest("view (collection/experiment/channel) names the channel a share link shows when the "
                             "scope is wider than one channel")
    shown = chan if view is None else _resources(view)[2]
    if shown is None or not (shown.experiment.collection_id == coll.pk
                             and (exp is None or shown.experiment_id == exp.pk) and (chan is None or shown == chan)):
        raise InvalidRequest(f"view {view!r} is not a channel inside the scope")
    return shown


TOKEN_FIELDS = {
    "id": serializers.IntegerField(), "label": serializers.CharField(),
    "scope": serializers.CharField(allow_null=True, help_text="null: an unscoped token"),
    "level": serializers.CharField(allow_null=True, help_text="read or write; null: the user's own levels"),
    "created": serializers.DateTimeField(), "expires": serializers.DateTimeField(allow_null=True),
    "expired": serializers.BooleanField(), "current": serializers.BooleanField(help_text="the token of this request"),
}
MINTED = inline_serializer("MintedToken", {**TOKEN_FIELDS, "key": serializers.CharField(help_text="shown once"),
                                           "share_url": serializers.CharField(required=False)})


class TokenList(APIView):
    @extend_schema(summary="List your tokens", description="Without their keys. A scoped token sees itself and the "
                   "tokens it minted.", auth=TOKEN_REQUIRED,
                   responses={200: inline_serializer("Tokens", {"tokens": inline_serializer(
                       "Token", TOKEN_FIELDS, many=True)}), **errors(401, 429)})
    def get(self, request: Any) -> Response:
        auth.require_login(request.user, "list tokens")
        return Response({"tokens": [_described(t, request.auth) for t in visible(request.user)]})

    @extend_schema(summary="Mint a scoped token (and a share link)",
                   description="Read or write on a collection, experiment or channel (or all your resources), "
                               f"expiring in at most {MAX_EXPIRES_IN_S} s; you need that level there. A scoped "
                               "caller mints only inside its scope, at most its level, expiring no later than it. "
                               "`share`: a read-only token's share link, which opens the channel in this server's "
                               "Neuroglancer; the token is in its fragment, which no request carries.",
                   request=MintSerializer, auth=TOKEN_REQUIRED,
                   responses={201: MINTED, **errors(400, 401, 403, 404, 409, 413, 415, 503)})
    def post(self, request: Any) -> Response:
        auth.require_login(request.user, "mint tokens")
        if not isinstance(request.data, dict):
            raise InvalidRequest("the body must be a JSON object: label, scope, level, expires_in[, share, view]")
        ser = MintSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        v = ser.validated_data
        where = _resources(v.get("scope"))
        expires = timezone.now() + timedelta(seconds=v["expires_in"])
        _may_mint(request.user, request.auth, where, Grant.LEVELS[v["level"]], expires)
        shown = _shown_channel(where, v["level"], v.get("view")) if v["share"] else None
        live = ApiToken.objects.filter(Q(expires__isnull=True) | Q(expires__gt=timezone.now()), user=request.user)
        if live.count() >= MAX_LIVE_TOKENS:
            raise Conflict(f"you hold {MAX_LIVE_TOKENS} live tokens: revoke some first")
        audit.record(request, action="mint", scope=v.get("scope", ""), level=v["level"], expires=expires.isoformat())
        coll, exp, chan = where
        token, key = ApiToken.mint(request.user, label=v["label"], level=v["level"], collection=coll, experiment=exp,
                                   channel=chan, expires=expires,
                                   parent=request.auth if scopes.of(request.user) is not None else None)
        body = {**_described(token, request.auth), "key": key}
        if shown is not None:
            body["share_url"] = share_url(request, shown, key)
        return Response(body, status=201)


class TokenView(APIView):
    @extend_schema(summary="Revoke one of your tokens", description="At once, on every web worker. A scoped token "
                   "revokes itself and the tokens it minted; another's token is a 404.", request=None,
                   auth=TOKEN_REQUIRED,
                   responses={204: OpenApiResponse(None, description="revoked, with the tokens it minted"),
                              **errors(401, 404, 503)})
    def delete(self, request: Any, token_id: int) -> Response:
        auth.require_login(request.user, "revoke tokens")
        token = next((t for t in visible(request.user) if t.pk == token_id), None)
        if token is None:
            raise NotFound(f"you hold no token {token_id}")
        audit.record(request, action="revoke", token=token_id)
        token.delete()
        return Response(status=204)
