"""`/v1/permissions/`: admins of a resource grant, list and revoke read/write/admin on it.

The target is in the body (a grant) or the query string (a list, a revoke; a revoke may send a
body instead, not both). A body is parsed only for a caller who is admin of some resource; the
caller must then be admin of the target itself."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups
from ndstore.api.models import Grant
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.core.errors import InvalidRequest, NotFound


class GrantSerializer(serializers.Serializer):
    user = serializers.CharField(max_length=150, required=False)
    collection = serializers.CharField(max_length=64)
    experiment = serializers.CharField(max_length=64, required=False)
    channel = serializers.CharField(max_length=64, required=False)
    level = serializers.ChoiceField(choices=list(Grant.LEVELS), required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "channel" in attrs and "experiment" not in attrs:
            raise serializers.ValidationError({"experiment": "a channel grant needs its experiment"})
        return attrs


RESOURCE_FIELDS = {
    "collection": serializers.CharField(max_length=64),
    "experiment": serializers.CharField(max_length=64, required=False),
    "channel": serializers.CharField(max_length=64, required=False, help_text="needs experiment"),
}
RESOURCE_QUERY = [OpenApiParameter(name, str, required=name == "collection", description=f"the grant's {name}")
                  for name in RESOURCE_FIELDS]
USER = serializers.CharField(max_length=150, help_text="the user's name")
LEVEL = serializers.ChoiceField(choices=list(Grant.LEVELS))
NOT_FOUND = {404: "no such collection, experiment, channel or user"}


def _body(request: Any) -> Any:
    auth.require_some_grant(request.user, auth.ADMIN, "grant or revoke permissions")
    return request.data


def _resource(where: dict[str, Any]) -> str:
    return "/".join(r.name for r in where.values() if r is not None)


def _target(request: Any, data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate the grant's fields, check the caller is admin of the resource."""
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object: user, collection[, experiment[, channel]], level")
    ser = GrantSerializer(data=data)
    ser.is_valid(raise_exception=True)
    v = ser.validated_data
    coll = lookups.collection(v["collection"])
    exp = lookups.experiment(coll, v["experiment"]) if "experiment" in v else None
    chan = lookups.channel(exp, v["channel"]) if exp is not None and "channel" in v else None
    auth.require(request.user, auth.ADMIN, coll, exp, chan)
    return {"collection": coll, "experiment": exp, "channel": chan}, v


def _user(name: str | None) -> Any:
    user = get_user_model().objects.filter(username=name).first() if name else None
    if user is None:
        raise NotFound(f"user {name!r} does not exist")
    return user


class PermissionsView(APIView):
    @extend_schema(
        summary="List the grants on a resource", description="Needs admin on the resource.",
        parameters=RESOURCE_QUERY, auth=TOKEN_REQUIRED,
        responses={200: inline_serializer("Grants", {"permissions": inline_serializer(
                       "UserLevel", {"user": USER, "level": LEVEL}, many=True)}),
                   **errors(400, 401, 403, 404, 429, meanings=NOT_FOUND)})
    def get(self, request: Any) -> Response:
        where, _ = _target(request, request.query_params.dict())
        grants = Grant.objects.filter(**where).select_related("user")
        return Response({"permissions": [{"user": g.user.username, "level": g.level} for g in grants]})

    @extend_schema(
        summary="Grant a user read, write or admin on a resource",
        description="Needs admin on the resource. A grant on a collection covers its experiments and channels; "
                    "granting again replaces the user's level there.",
        request=inline_serializer("Grant", {"user": USER, **RESOURCE_FIELDS, "level": LEVEL}),
        responses={201: inline_serializer("Granted", {"user": USER, "level": LEVEL}),
                   **errors(400, 401, 403, 404, 413, 415, 503, meanings=NOT_FOUND)})
    def post(self, request: Any) -> Response:
        where, v = _target(request, _body(request))
        if "level" not in v:
            raise InvalidRequest("level (read, write or admin) is required")
        user = _user(v.get("user"))
        audit.record(request, action="grant", user=user.username, resource=_resource(where), level=v["level"])
        with transaction.atomic():  # with the ingest leaves it revokes (ingest_leaves.py), or not at all
            Grant.objects.update_or_create(user=user, **where, defaults={"level": v["level"]})
        return Response({"user": user.username, "level": v["level"]}, status=201)

    @extend_schema(
        summary="Revoke a user's grant on a resource",
        description="Needs admin on the resource. The grant is named in the query string, or instead in a JSON "
                    "body with the same fields (not both).",
        parameters=[OpenApiParameter(name, str, description=f"the grant's {name}")
                    for name in ("user", *RESOURCE_FIELDS)],
        responses={204: OpenApiResponse(None, description="revoked (also when there was no such grant)"),
                   **errors(400, 401, 403, 404, 413, 415, 503, meanings=NOT_FOUND)})
    def delete(self, request: Any) -> Response:
        query = request.query_params.dict()
        if query and request.META.get("CONTENT_LENGTH", "0") not in ("", "0"):
            raise InvalidRequest("name the grant to revoke in the query string or in the body, not both")
        where, v = _target(request, query or _body(request))
        user = _user(v.get("user"))
        audit.record(request, action="revoke", user=user.username, resource=_resource(where))
        with transaction.atomic():  # with the ingest leaves it revokes (ingest_leaves.py), or not at all
            Grant.objects.filter(user=user, **where).delete()
        return Response(status=204)
