"""`/v1/permissions/`: admins of a resource grant, list and revoke read/write/admin on it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import auth, lookups
from ndstore.api.models import Grant
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


def _target(request: Any, data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate the grant's fields, check the caller is admin of the resource."""
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
    def get(self, request: Any) -> Response:
        where, _ = _target(request, request.query_params.dict())
        grants = Grant.objects.filter(**where).select_related("user")
        return Response({"permissions": [{"user": g.user.username, "level": g.level} for g in grants]})

    def post(self, request: Any) -> Response:
        where, v = _target(request, request.data)
        if "level" not in v:
            raise InvalidRequest("level (read, write or admin) is required")
        user = _user(v.get("user"))
        Grant.objects.update_or_create(user=user, **where, defaults={"level": v["level"]})
        return Response({"user": user.username, "level": v["level"]}, status=201)

    def delete(self, request: Any) -> Response:
        where, v = _target(request, request.query_params.dict() or request.data)
        Grant.objects.filter(user=_user(v.get("user")), **where).delete()
        return Response(status=204)
