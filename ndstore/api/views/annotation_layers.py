"""Annotation layers and their annotations, written through the API (docs/api.md, "Annotations").

- `/v1/annotations/{c}/{e}/`: GET lists the experiment's layers.
- `/v1/annotations/{c}/{e}/{layer}/`: GET describes one, POST creates it, DELETE deletes it
  with its annotations.
- `/v1/annotations/{c}/{e}/{layer}/annotations/`: POST writes up to MAX_PER_REQUEST annotations
  (JSON or CSV), idempotent by id: an id written again is replaced, relationships included.
- `/v1/annotations/{c}/{e}/{layer}/annotations/delete/`: POST a JSON list of ids deletes them.

Reading needs read permission on the experiment, everything else write permission, checked
before the body is read; the layer's label channel must be an annotation channel of the same
experiment the caller may read. Every change is audited before it is made (ndstore.api.audit)
and bumps the layer's version, which the served indexes follow at once
(ndstore.api.views.annotation_files). A layer holds at most MAX_PER_LAYER annotations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups
from ndstore.api.annotation_body import (
    MAX_PER_REQUEST,
    AnnotationCSVParser,
    AnnotationJSONParser,
    CSVText,
    parse_csv_annotations,
    parse_json_annotations,
)
from ndstore.api.annotation_index import forget, frame_of
from ndstore.api.annotation_input import Batch, Target, annotation_id, arrays, parse_layer
from ndstore.api.models import Annotation, AnnotationLayer, AnnotationSegment, Channel, Experiment, signed_id
from ndstore.api.schema import errors
from ndstore.core.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge

MAX_PER_LAYER = 1_000_000
MAX_LAYERS = 100  # per experiment
BATCH = 1000
AUDITED_RUNS = 100
GEOMETRY = ("ax", "ay", "az", "bx", "by", "bz")
BOUNDS = ("lo_x", "lo_y", "lo_z", "hi_x", "hi_y", "hi_z")


def experiment_of(request: Any, kw: dict[str, Any], level: int) -> Experiment:
    coll = lookups.collection(kw["collection"])
    exp = lookups.experiment(coll, kw["experiment"])
    auth.require(request.user, level, coll, exp)
    return exp


def layer_of(request: Any, kw: dict[str, Any], level: int) -> AnnotationLayer:
    """The named layer, once the caller holds ``level`` on its experiment."""
    exp = experiment_of(request, kw, level)
    layer = (AnnotationLayer.objects.select_related("experiment__collection", "experiment__coord_frame", "segmentation")
             .filter(experiment=exp, name=kw["layer"]).first())
    if layer is None:
        raise NotFound(f"annotation layer {exp.collection.name}/{exp.name}/{kw['layer']} does not exist")
    return layer


def target_of(layer: AnnotationLayer) -> Target:
    top = int(np.iinfo(layer.segmentation.datatype).max) if layer.segmentation else 0
    lower, upper = frame_of(layer)
    return Target(layer.annotation_type, layer.properties, layer.relationships, top, lower, upper)


def path_of(layer: AnnotationLayer) -> str:
    return f"{layer.experiment.collection.name}/{layer.experiment.name}/{layer.name}"


def described(layer: AnnotationLayer) -> dict[str, Any]:
    return {"name": layer.name, "description": layer.description, "annotation_type": layer.annotation_type,
            "properties": layer.properties, "relationships": layer.relationships,
            "segmentation": layer.segmentation.name if layer.segmentation else None, "version": layer.version,
            "annotations": Annotation.objects.filter(layer=layer).count(),
            "precomputed": f"/precomputed-annotations/{path_of(layer)}"}


def id_runs(ids: list[int]) -> list[str]:
    """The ids as the audit log keeps them: ascending runs `a-b` (or `a`), at most AUDITED_RUNS."""
    runs: list[list[int]] = []
    for aid in sorted(ids):
        if runs and aid == runs[-1][1] + 1:
            runs[-1][1] = aid
        else:
            runs.append([aid, aid])
    shown = [f"{a}-{b}" if a != b else str(a) for a, b in runs[:AUDITED_RUNS]]
    return shown + ([f"... and {len(runs) - AUDITED_RUNS} more runs"] if len(runs) > AUDITED_RUNS else [])


LAYER = inline_serializer("AnnotationLayer", {
    "name": serializers.CharField(), "description": serializers.CharField(),
    "annotation_type": serializers.ChoiceField(choices=AnnotationLayer.TYPES),
    "properties": serializers.ListField(child=serializers.DictField(), help_text=(
        "Neuroglancer's property specs: id, type (uint8..float32, rgb, rgba), description, enum_values, enum_labels")),
    "relationships": serializers.ListField(child=serializers.CharField()),
    "segmentation": serializers.CharField(allow_null=True, help_text="the label channel relationships refer to"),
    "version": serializers.IntegerField(help_text="grows with every write"),
    "annotations": serializers.IntegerField(help_text="how many the layer holds"),
    "precomputed": serializers.CharField(help_text="where Neuroglancer reads it: precomputed://<server><this>"),
})
LAYER_WRITE = inline_serializer("AnnotationLayerCreate", {
    "annotation_type": serializers.ChoiceField(choices=AnnotationLayer.TYPES),
    "description": serializers.CharField(required=False, allow_blank=True, max_length=4096),
    "properties": serializers.ListField(child=serializers.DictField(), required=False, max_length=16),
    "relationships": serializers.ListField(child=serializers.CharField(), required=False, max_length=8),
    "segmentation": serializers.CharField(required=False, help_text="a label channel of this experiment"),
})
LAYERS = inline_serializer("AnnotationLayers", {"layers": serializers.ListField(child=LAYER)})
WRITTEN = inline_serializer("AnnotationsWritten", {"written": serializers.IntegerField(),
                                                   "version": serializers.IntegerField()})
DELETED = inline_serializer("AnnotationsDeleted", {"deleted": serializers.IntegerField(),
                                                   "version": serializers.IntegerField()})
ANNOTATION = inline_serializer("AnnotationWrite", {
    "id": serializers.CharField(help_text="uint64, a decimal string or a JSON integer"),
    "point": serializers.ListField(child=serializers.FloatField(), required=False, help_text="point: x, y, z"),
    "pointA": serializers.ListField(child=serializers.FloatField(), required=False, help_text="line, box"),
    "pointB": serializers.ListField(child=serializers.FloatField(), required=False, help_text="line, box"),
    "center": serializers.ListField(child=serializers.FloatField(), required=False, help_text="ellipsoid"),
    "radii": serializers.ListField(child=serializers.FloatField(), required=False, help_text="ellipsoid"),
    "properties": serializers.DictField(required=False, help_text="property id -> value"),
    "relationships": serializers.DictField(required=False, help_text="relationship id -> segment ids"),
})
BULK = type(ANNOTATION)(many=True, max_length=MAX_PER_REQUEST)
IDS = {"application/json": {"type": "array", "maxItems": MAX_PER_REQUEST, "items": {
    "type": "string", "description": "an annotation id, 1..2^64-1 in decimal (JSON integers are taken too)"}}}
NO_LAYER = {404: "no such collection, experiment or layer"}


class LayerList(APIView):
    @extend_schema(summary="The annotation layers of an experiment", responses={
        200: LAYERS, **errors(401, 403, 404, 429, meanings={404: "no such collection or experiment"})})
    def get(self, request: Any, **kw: Any) -> Response:
        exp = experiment_of(request, kw, auth.READ)
        layers = AnnotationLayer.objects.select_related("experiment__collection", "segmentation").filter(
            experiment=exp).order_by("name")
        return Response({"layers": [described(layer) for layer in layers]})


def _segmentation(request: Any, exp: Experiment, name: str | None) -> Channel | None:
    """The label channel a new layer's relationships refer to: of the same experiment, readable."""
    if name is None:
        return None
    chan = Channel.objects.filter(experiment=exp, name=name).first()
    if chan is None:
        raise InvalidRequest(f"segmentation: the experiment {exp.collection.name}/{exp.name} has no channel "
                             f"{name[:64]!r} (relationships refer to a label channel of the layer's own experiment)")
    if chan.type != "annotation":
        raise InvalidRequest(f"segmentation: {chan.name} is an {chan.type} channel, not a label (annotation) channel")
    auth.require(request.user, auth.READ, exp.collection, exp, chan)
    return chan


class LayerView(APIView):
    @extend_schema(summary="One annotation layer", responses={200: LAYER, **errors(401, 403, 404, 429,
                                                                                    meanings=NO_LAYER)})
    def get(self, request: Any, **kw: Any) -> Response:
        return Response(described(layer_of(request, kw, auth.READ)))

    @extend_schema(summary="Create an annotation layer", request=LAYER_WRITE, description=(
        "Write permission on the experiment. One geometry type per layer (as Neuroglancer requires); properties "
        "are Neuroglancer's property specs; relationships refer to a label channel of the same experiment."),
        responses={201: LAYER, **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings={
            409: f"the layer exists, or the experiment has {MAX_LAYERS} layers"})})
    def post(self, request: Any, **kw: Any) -> Response:
        exp = experiment_of(request, kw, auth.WRITE)  # before the body is read
        spec = parse_layer(request.data)
        chan = _segmentation(request, exp, spec.pop("segmentation"))
        name = f"{exp.collection.name}/{exp.name}/{kw['layer']}"
        if AnnotationLayer.objects.filter(experiment=exp, name=kw["layer"]).exists():
            raise Conflict(f"annotation layer {name} already exists")
        if AnnotationLayer.objects.filter(experiment=exp).count() >= MAX_LAYERS:
            raise Conflict(f"an experiment holds at most {MAX_LAYERS} annotation layers")
        audit.record(request, action="create", annotation_layer=name)
        try:
            with transaction.atomic():
                layer = AnnotationLayer.objects.create(experiment=exp, name=kw["layer"], segmentation=chan,
                                                       creator=request.user, **spec)
        except IntegrityError:  # a concurrent request created it first
            raise Conflict(f"annotation layer {name} already exists") from None
        return Response(described(layer), status=201)

    @extend_schema(summary="Delete an annotation layer and its annotations", request=None, responses={
        204: OpenApiResponse(None, description="deleted"), **errors(401, 403, 404, 503, meanings=NO_LAYER)})
    def delete(self, request: Any, **kw: Any) -> Response:
        layer = layer_of(request, kw, auth.WRITE)
        audit.record(request, action="delete", annotation_layer=path_of(layer))
        with transaction.atomic():
            AnnotationSegment.objects.filter(layer=layer).delete()
            Annotation.objects.filter(layer=layer).delete()
            layer.delete()
        forget(layer.pk)
        return Response(status=204)


Rows = list[tuple[Any, ...]]


def _stored(layer: AnnotationLayer, batch: Batch, target: Target) -> tuple[Rows, Rows]:
    """The rows of the annotation table (layer, aid, geometry, bounds, record) and of the
    relationship table (layer, relationship, segment, aid) a batch writes."""
    geometry, lo, hi, records = arrays(target, batch)
    a = geometry.astype(np.float64)
    ab = np.concatenate([a, a], axis=1) if a.shape[1] == 3 else a
    boxes = np.concatenate([lo, hi], axis=1)
    rows: Rows = []
    related: Rows = []
    for i, (aid, g, box) in enumerate(zip(batch.ids, ab.tolist(), boxes.tolist())):
        stored = signed_id(aid)
        rows.append((layer.pk, stored, *g, *box, records[i].tobytes()))
        related.extend((layer.pk, r, signed_id(segment), stored)
                       for r, segments in enumerate(batch.related[i]) for segment in segments)
    return rows, related


def _upsert(rows: Rows, related: Rows) -> None:
    """One INSERT ... ON CONFLICT DO UPDATE, executemany (SQLite and PostgreSQL spell it alike): the
    ORM's bulk_create spent about 2 of the 2.5 s of a 10,000-annotation write building models and SQL."""
    q = connection.ops.quote_name
    columns = [q(c) for c in ("layer_id", "aid", *GEOMETRY, *BOUNDS, "record")]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {q(Annotation._meta.db_table)} ({', '.join(columns)}) VALUES "
                           f"({', '.join(['%s'] * len(columns))}) ON CONFLICT ({columns[0]}, {columns[1]}) "
                           f"DO UPDATE SET {updates}", rows)
        if related:
            links = ", ".join(q(c) for c in ("layer_id", "relationship", "segment", "aid"))
            cursor.executemany(f"INSERT INTO {q(AnnotationSegment._meta.db_table)} ({links}) VALUES (%s, %s, %s, %s)",
                               related)


def _bump(layer: AnnotationLayer) -> int:
    AnnotationLayer.objects.filter(pk=layer.pk).update(version=F("version") + 1)
    return int(AnnotationLayer.objects.filter(pk=layer.pk).values_list("version", flat=True).get())


def _existing(layer: AnnotationLayer, signed: list[int]) -> int:
    rows = Annotation.objects.filter(layer=layer)
    return sum(rows.filter(aid__in=signed[i:i + BATCH]).count() for i in range(0, len(signed), BATCH))


class AnnotationWrites(APIView):
    parser_classes = [AnnotationJSONParser, AnnotationCSVParser]

    @extend_schema(summary="Write annotations (JSON or CSV)", request={"application/json": BULK, "text/csv": str},
                   description=f"At most {MAX_PER_REQUEST} annotations and 1 MiB per request, as a JSON list or a CSV "
                               "with a header row (docs/api.md). Idempotent by id: an id written again is replaced, "
                               "its relationships too. Write permission on the experiment.",
                   responses={200: WRITTEN, **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings={
                       **NO_LAYER, 409: f"the layer would hold over {MAX_PER_LAYER} annotations"})})
    def post(self, request: Any, **kw: Any) -> Response:
        layer = layer_of(request, kw, auth.WRITE)  # before the body is read
        target = target_of(layer)
        data = request.data
        batch = parse_csv_annotations(data, target) if isinstance(data, CSVText) else \
            parse_json_annotations(data, target)
        rows, related = _stored(layer, batch, target)
        signed = [row[1] for row in rows]
        if Annotation.objects.filter(layer=layer).count() + len(signed) - _existing(layer, signed) > MAX_PER_LAYER:
            raise Conflict(f"a layer holds at most {MAX_PER_LAYER} annotations; delete some first")
        audit.record(request, action="write", annotation_layer=path_of(layer), annotations=len(rows),
                     ids=id_runs(batch.ids))
        with transaction.atomic():
            for i in range(0, len(signed), BATCH):
                AnnotationSegment.objects.filter(layer=layer, aid__in=signed[i:i + BATCH]).delete()
            _upsert(rows, related)
            version = _bump(layer)
        return Response({"written": len(rows), "version": version})


class AnnotationDeletes(APIView):
    parser_classes = [AnnotationJSONParser]

    @extend_schema(summary="Delete annotations by id", request=IDS, description=(
        f"A JSON list of at most {MAX_PER_REQUEST} ids (decimal strings or integers); ids the layer does not hold "
        "are skipped. Write permission on the experiment."),
        responses={200: DELETED, **errors(400, 401, 403, 404, 413, 415, 503, meanings=NO_LAYER)})
    def post(self, request: Any, **kw: Any) -> Response:
        layer = layer_of(request, kw, auth.WRITE)
        raw = request.data
        if not isinstance(raw, list) or not raw:
            raise InvalidRequest("the body must be a non-empty JSON list of annotation ids")
        if len(raw) > MAX_PER_REQUEST:
            raise PayloadTooLarge(f"the body lists {len(raw)} ids; at most {MAX_PER_REQUEST} per request")
        ids = sorted({annotation_id(item, f"id {i}") for i, item in enumerate(raw)})
        audit.record(request, action="delete", annotation_layer=path_of(layer), ids=id_runs(ids))
        signed = [signed_id(i) for i in ids]
        deleted = 0
        with transaction.atomic():
            for i in range(0, len(signed), BATCH):
                AnnotationSegment.objects.filter(layer=layer, aid__in=signed[i:i + BATCH]).delete()
                deleted += Annotation.objects.filter(layer=layer, aid__in=signed[i:i + BATCH]).delete()[0]
            version = _bump(layer)
        return Response({"deleted": deleted, "version": version})


ROUTES: list[tuple[str, type[APIView]]] = [
    ("", LayerList), ("<name:layer>/", LayerView), ("<name:layer>/annotations/", AnnotationWrites),
    ("<name:layer>/annotations/delete/", AnnotationDeletes)]
