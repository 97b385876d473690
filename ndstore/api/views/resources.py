"""Boss v1 resource endpoints: coordinate frames, collections, experiments, channels.

GET needs read, POST/PUT/DELETE need admin on the parent (or on the resource itself);
collections and coordinate frames are created by resource managers (staff users).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions
from rest_framework import serializers as drf_serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups, scopes
from ndstore.api.models import Collection, CoordinateFrame, Experiment, Grant
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.api.serializers import (
    ChannelSerializer,
    CollectionSerializer,
    CoordinateFrameSerializer,
    ExperimentSerializer,
)
from ndstore.core.errors import Conflict, InvalidRequest, NotFound
from ndstore.wiring import services


class ResourceView(APIView):
    """GET/POST/PUT/DELETE of one named resource. Subclasses say how to find it and its parent."""

    serializer_class: type[drf_serializers.ModelSerializer]
    kind: str
    audit_key: str  # how the audit log names this kind of resource

    def find(self, **names: str) -> tuple[dict[str, Any], Any]:
        """Return (the parent fields to save with, the resource or None)."""
        raise NotImplementedError

    def check(self, request: Any, level: int, parents: dict[str, Any], obj: Any) -> None:
        raise NotImplementedError

    def target(self, **names: str) -> dict[str, str]:
        """The resource, as the audit log names it: {kind: "collection/experiment/..."}."""
        return {self.audit_key: "/".join(names.values())}

    def existing(self, **names: str) -> tuple[dict[str, Any], Any]:
        parents, obj = self.find(**names)
        if obj is None:
            raise NotFound(f"{self.kind} {'/'.join(names.values())} does not exist")
        return parents, obj

    def get(self, request: Any, **names: str) -> Response:
        parents, obj = self.existing(**names)
        self.check(request, auth.READ, parents, obj)
        return Response(self.serializer_class(obj, context=parents).data)

    def post(self, request: Any, **names: str) -> Response:
        parents, obj = self.find(**names)
        self.check(request, auth.ADMIN, parents, None)
        if obj is not None:
            raise Conflict(f"{self.kind} {'/'.join(names.values())} already exists")
        data = {**_require_object(request.data), "name": names["name"]}
        serializer = self.serializer_class(data=data, context=parents)
        serializer.is_valid(raise_exception=True)
        audit.record(request, action="create", **self.target(**names))
        try:
            with transaction.atomic():
                created = serializer.save(creator=request.user, **parents)
                self.after_create(request, created)
        except IntegrityError:  # a concurrent request created it first
            raise Conflict(f"{self.kind} {'/'.join(names.values())} already exists") from None
        return Response(self.serializer_class(created, context=parents).data, status=201)

    def put(self, request: Any, **names: str) -> Response:
        parents, obj = self.existing(**names)
        self.check(request, auth.ADMIN, parents, obj)
        _require_object(request.data)
        serializer = self.serializer_class(obj, data=request.data, partial=True, context=parents)
        serializer.is_valid(raise_exception=True)
        if request.data.get("name", obj.name) != obj.name:
            raise InvalidRequest("renaming a resource is not supported")
        audit.record(request, action="change", **self.target(**names))
        return Response(self.serializer_class(serializer.save(), context=parents).data)

    def delete(self, request: Any, **names: str) -> Response:
        parents, obj = self.existing(**names)
        self.check(request, auth.ADMIN, parents, obj)
        audit.record(request, action="delete", **self.target(**names))
        self.before_delete(obj)
        obj.delete()
        return Response(status=204)

    def after_create(self, request: Any, obj: Any) -> None:
        pass

    def before_delete(self, obj: Any) -> None:
        pass


def _fields_of(serializer: type[drf_serializers.ModelSerializer]) -> type[drf_serializers.ModelSerializer]:
    """What a create or change reads: the resource's fields less its name, which the URL gives. Its
    OpenAPI components are the resource's with the suffix Request (and the prefix Patched for PUT)."""
    fields = [field for field in serializer.Meta.fields if field != "name"]
    body = type(serializer.__name__, (serializer,), {"Meta": type("Meta", (serializer.Meta,), {"fields": fields})})
    return extend_schema_serializer(component_name=serializer.__name__.removesuffix("Serializer"))(body)


def resource_schema(*, access: str, on_delete: str, nested: bool, read_needs_token: bool = False,
                    ) -> Callable[[type[ResourceView]], type[ResourceView]]:
    """The OpenAPI description of a ResourceView: its serializer's fields in and out; `access` says
    who may do what, `on_delete` when a delete is refused (409) and what it removes."""
    def describe(view: type[ResourceView]) -> type[ResourceView]:
        out, kind = view.serializer_class, view.kind
        a_kind = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        body = _fields_of(out)
        fixed = ", ".join(getattr(out, "immutable", ())) or "none"
        return extend_schema_view(
            get=extend_schema(summary=f"Read {a_kind}", description=access,
                              auth=TOKEN_REQUIRED if read_needs_token else None,
                              responses={200: out, **errors(401, *(() if read_needs_token else (403,)), 404, 429)}),
            post=extend_schema(
                summary=f"Create {a_kind}",
                description=f"{access} The body holds its fields; its name is the URL's. Fields that fix how its "
                            f"data is stored cannot change later: {fixed}.",
                request=body,
                responses={201: out, **errors(400, 401, 403, *((404,) if nested else ()), 409, 413, 415, 503)}),
            put=extend_schema(
                summary=f"Change {a_kind}",
                description=f"{access} The body holds the fields to change. Renaming is not supported; these fields "
                            f"cannot change: {fixed}.",
                request=body(partial=True),
                responses={200: out, **errors(400, 401, 403, 404, 413, 415, 503)}),
            delete=extend_schema(
                summary=f"Delete {a_kind}", description=f"{access} {on_delete}", request=None,
                responses={204: OpenApiResponse(None, description="deleted"), **errors(401, 403, 404, 409, 503)}),
        )(view)
    return describe


def _require_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object of the resource's fields")
    return data


def _refuse_if(children: Any, what: str, obj: Any) -> None:
    if children.exists():
        raise Conflict(f"{obj.name} still has {what}; delete them first")


@resource_schema(access="Reading needs a token; creating, changing and deleting need a staff user.",
                 on_delete="Refused while experiments use it.", nested=False, read_needs_token=True)
class CoordFrameView(ResourceView):
    audit_key = "coord"
    serializer_class = CoordinateFrameSerializer
    kind = "coordinate frame"

    def find(self, **names: str) -> tuple[dict[str, Any], Any]:
        return {}, CoordinateFrame.objects.filter(name=names["name"]).first()

    def check(self, request: Any, level: int, parents: dict[str, Any], obj: Any) -> None:
        scope = scopes.of(request.user)
        if level > auth.READ:
            auth.require_staff(request.user, "create, change or delete coordinate frames")
        elif scope is not None:  # only the frames of the experiments inside its scope
            if obj is None or not obj.experiments.filter(scope.experiments()).exists():
                raise exceptions.PermissionDenied(f"this token is scoped to {scope.path or 'some resources'} and "
                                                  f"reads no coordinate frame outside it")
        elif not (obj is not None and obj.experiments.filter(collection__public=True).exists()):
            # a public channel's frame is read anonymously: Neuroglancer's boss:// source reads it
            # before any chunk
            auth.require_login(request.user, "read coordinate frames that no public collection uses")

    def before_delete(self, obj: Any) -> None:
        _refuse_if(obj.experiments, "experiments using it", obj)


@resource_schema(access="Reading needs read permission on it (none when it is public); creating needs a staff user, "
                        "who becomes its admin; changing and deleting need admin on it.",
                 on_delete="Refused while it has experiments.", nested=False)
class CollectionView(ResourceView):
    audit_key = "collection"
    serializer_class = CollectionSerializer
    kind = "collection"

    def find(self, **names: str) -> tuple[dict[str, Any], Any]:
        return {}, Collection.objects.filter(name=names["name"]).first()

    def check(self, request: Any, level: int, parents: dict[str, Any], obj: Any) -> None:
        if obj is None:
            auth.require_staff(request.user, "create collections")
        else:
            auth.require(request.user, level, obj)

    def after_create(self, request: Any, obj: Any) -> None:
        Grant.objects.create(user=request.user, collection=obj, level="admin")

    def before_delete(self, obj: Any) -> None:
        _refuse_if(obj.experiments, "experiments", obj)


@resource_schema(access="Reading needs read permission on it; creating needs admin on its collection; changing and "
                        "deleting need admin on it.",
                 on_delete="Refused while it has channels.", nested=True)
class ExperimentView(ResourceView):
    audit_key = "experiment"
    serializer_class = ExperimentSerializer
    kind = "experiment"

    def find(self, **names: str) -> tuple[dict[str, Any], Any]:
        coll = lookups.collection(names["collection"])
        return {"collection": coll}, coll.experiments.filter(name=names["name"]).first()

    def check(self, request: Any, level: int, parents: dict[str, Any], obj: Any) -> None:
        auth.require(request.user, level, parents["collection"], obj)

    def before_delete(self, obj: Any) -> None:
        _refuse_if(obj.channels, "channels", obj)


@resource_schema(access="Reading needs read permission on it; creating needs admin on its experiment; changing and "
                        "deleting need admin on it.",
                 on_delete="Deletes its voxels too (cached, buffered and stored, at every level and time sample it "
                           "ever stored). Refused while another channel names it a source, an ingest job of it "
                           "uploads or a downsample build of it runs.", nested=True)
class ChannelView(ResourceView):
    audit_key = "channel"
    serializer_class = ChannelSerializer
    kind = "channel"

    def find(self, **names: str) -> tuple[dict[str, Any], Any]:
        exp = lookups.experiment(lookups.collection(names["collection"]), names["experiment"])
        return {"experiment": exp}, exp.channels.filter(name=names["name"]).first()

    def check(self, request: Any, level: int, parents: dict[str, Any], obj: Any) -> None:
        exp = parents["experiment"]
        auth.require(request.user, level, exp.collection, exp, obj)

    def before_delete(self, obj: Any) -> None:
        sourcing = [c.name for c in obj.experiment.channels.exclude(pk=obj.pk) if obj.name in c.sources]
        if sourcing:
            raise Conflict(f"{obj.name} is the source of {', '.join(sourcing)}; delete those first")
        layers = [layer.name for layer in obj.annotation_layers.all()]
        if layers:
            raise Conflict(f"the annotation layers {', '.join(layers)} relate to the segments of {obj.name}; delete "
                           "them first")
        # A running job would keep writing into the purged channel, and its queues and tiles
        # would outlive it with no row left to cancel them by.
        ingests = [str(j.id) for j in obj.ingest_jobs.filter(state="uploading")]
        if ingests:
            raise Conflict(f"{obj.name} has ingest jobs in progress ({', '.join(ingests)}); cancel them first "
                           "(DELETE /v1/ingest/{id}/) or complete them")
        if obj.downsample_jobs.filter(state="IN_PROGRESS").exists():
            raise Conflict(f"{obj.name} is being downsampled; cancel the build first "
                           "(DELETE /v1/downsample/{collection}/{experiment}/{channel}/)")
        volume = lookups.channel_volume(obj)
        services().plane.purge(volume)
        if (products := services().products) is not None:
            products.forget(volume.name_prefix)


def names_schema(component: str, key: str, *codes: int, **kwargs: Any) -> Callable[[type], type]:
    return extend_schema(responses={200: inline_serializer(component, {key: drf_serializers.ListField(
        child=drf_serializers.CharField(), help_text="names, sorted")}), **errors(*codes)}, **kwargs)


class ListView(APIView):
    """GET of the names in one level of the hierarchy that the caller may read."""

    key: str

    def names(self, request: Any, **names: str) -> list[str]:
        raise NotImplementedError

    def get(self, request: Any, **names: str) -> Response:
        return Response({self.key: sorted(self.names(request, **names))})


@names_schema("CollectionNames", "collections", 401, 429, summary="List the collections",
              description="Those the caller may read (anonymous: the public ones).")
class CollectionList(ListView):
    key = "collections"

    def names(self, request: Any, **names: str) -> list[str]:
        return [c.name for c in Collection.objects.all() if auth.access_level(request.user, c) >= auth.READ]


@names_schema("ExperimentNames", "experiments", 401, 403, 404, 429, summary="List a collection's experiments",
              description="Needs read permission on the collection.")
class ExperimentList(ListView):
    key = "experiments"

    def names(self, request: Any, **names: str) -> list[str]:
        coll = lookups.collection(names["collection"])
        auth.require(request.user, auth.READ, coll)
        return [e.name for e in coll.experiments.all()]


@names_schema("ChannelNames", "channels", 401, 403, 404, 429, summary="List an experiment's channels",
              description="Needs read permission on the experiment.")
class ChannelList(ListView):
    key = "channels"

    def names(self, request: Any, **names: str) -> list[str]:
        exp = lookups.experiment(lookups.collection(names["collection"]), names["experiment"])
        auth.require(request.user, auth.READ, exp.collection, exp)
        return [c.name for c in exp.channels.all()]


@names_schema("CoordNames", "coords", 401, 429, summary="List the coordinate frames", description="Needs a token.",
              auth=TOKEN_REQUIRED)
class CoordFrameList(ListView):
    key = "coords"

    def names(self, request: Any, **names: str) -> list[str]:
        auth.require_login(request.user, "list coordinate frames")
        scope = scopes.of(request.user)
        frames = CoordinateFrame.objects.all()
        if scope is not None:  # those of the experiments inside its scope
            frames = CoordinateFrame.objects.filter(
                pk__in=Experiment.objects.filter(scope.experiments()).values("coord_frame"))
        return [f.name for f in frames]
