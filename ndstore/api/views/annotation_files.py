"""Annotation layers as Neuroglancer precomputed annotations, read-only and live, under
`/precomputed-annotations/{c}/{e}/{layer}/` (a prefix no channel's view uses):

- `info`: `neuroglancer_annotations_v1`: the experiment's frame (level-0 voxels, their size in
  metres), the type, properties, relationships, the `by_id` key and the spatial levels.
- `spatial{level}/{x}_{y}_{z}`: a cell of a spatial level (ndstore.core.annotations.spatial).
- `by_id/{id}`: one annotation with its related segments (404 for an id the layer lacks).
- `rel_{relationship}/{segment}`: the annotations related to a segment (none: an empty list).

Unsharded: every file is computed per request from the layer's build (ndstore.api.annotation_index)
and the relationship table; sharding would only cut the number of files of a static copy
(docs/design/annotations.md). Reading needs read permission on the experiment (anonymous on a
public collection); answers carry CORS, a strong ETag and `Cache-Control: no-cache`, so a
viewer's next request sees a write at once (ndstore.api.browser_http).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response

from ndstore.api import auth, budget
from ndstore.api.annotation_index import Built, built
from ndstore.api.annotation_input import TOP
from ndstore.api.models import AnnotationLayer, AnnotationSegment, signed_id, unsigned_id
from ndstore.api.schema import errors
from ndstore.api.segment_input import parse_id
from ndstore.api.views.annotation_layers import layer_of
from ndstore.api.views.precomputed import NOT_MODIFIED, PrecomputedView
from ndstore.core import precomputed
from ndstore.core.annotations.layout import NEUROGLANCER_TYPE, annotation_list, with_relationships
from ndstore.core.errors import NotFound

OCTET = "application/octet-stream"
FILE_ERRORS = errors(401, 403, 404, 429, meanings={404: "no such collection, experiment, layer or file"})
BINARY = {(200, OCTET): OpenApiResponse(OpenApiTypes.BINARY, description="Neuroglancer's multiple annotation "
                                                                           "encoding"), 304: NOT_MODIFIED}


def voxel_metres(layer: AnnotationLayer) -> tuple[float, float, float]:
    f = layer.experiment.coord_frame
    nm = precomputed.voxel_size_nm((f.x_voxel_size, f.y_voxel_size, f.z_voxel_size), f.voxel_unit)
    return nm[0] * 1e-9, nm[1] * 1e-9, nm[2] * 1e-9


def served(request: Any, kw: dict[str, Any]) -> tuple[AnnotationLayer, Built]:
    """The layer and its build; a request that has to build it first reserves what the build holds."""
    layer = layer_of(request, kw, auth.READ)
    return layer, built(layer, voxel_metres(layer), lambda held: budget.reserve(request, held, None, reading=0))


def answer(body: bytes, content_type: str, request: Any) -> HttpResponse:
    """A file of the layer: re-validated on every use (the ETag answers cheaply), never stale."""
    budget.reserve(request, len(body), None, reading=len(body))
    response = HttpResponse(body, content_type=content_type)
    response["Vary"] = "Authorization"
    response["Cache-Control"] = "no-cache"
    return response


def info(layer: AnnotationLayer, index: Built) -> dict[str, Any]:
    f = layer.experiment.coord_frame
    return {
        "@type": "neuroglancer_annotations_v1",
        "dimensions": {axis: [size, "m"] for axis, size in zip("xyz", voxel_metres(layer))},
        "lower_bound": [f.x_start, f.y_start, f.z_start], "upper_bound": [f.x_stop, f.y_stop, f.z_stop],
        "annotation_type": NEUROGLANCER_TYPE[layer.annotation_type],
        "properties": layer.properties,
        "relationships": [{"id": rel, "key": f"rel_{rel}"} for rel in layer.relationships],
        "by_id": {"key": "by_id"},
        "spatial": [{"key": f"spatial{i}", "grid_shape": list(level.grid_shape), "chunk_size": list(level.chunk_size),
                     "limit": level.limit} for i, level in enumerate(index.levels)],
    }


class InfoFile(PrecomputedView):
    @extend_schema(summary="An annotation layer's precomputed info", responses={
        (200, "application/json"): OpenApiResponse(OpenApiTypes.OBJECT, description="neuroglancer_annotations_v1"),
        304: NOT_MODIFIED, **FILE_ERRORS})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        layer, index = served(request, kw)
        return answer(json.dumps(info(layer, index)).encode(), "application/json", request)


class SpatialFile(PrecomputedView):
    @extend_schema(summary="A cell of an annotation layer's spatial index", responses={**BINARY, **FILE_ERRORS})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        _, index = served(request, kw)
        cell = (kw["x"], kw["y"], kw["z"])
        if kw["level"] >= len(index.levels) or not index.levels[kw["level"]].contains(cell):
            raise NotFound(f"the spatial index has no level {kw['level']} cell {cell}; its info lists the levels")
        members = index.levels[kw["level"]].cell(*cell)
        return answer(annotation_list(index.records[members], index.ids[members]), OCTET, request)


ID = OpenApiParameter("id", str, OpenApiParameter.PATH, description="the annotation id, 1..2^64-1 in decimal")
SEGMENT = OpenApiParameter("segment", str, OpenApiParameter.PATH, description="the segment id, in decimal")


class ByIdFile(PrecomputedView):
    @extend_schema(summary="One annotation, with its related segments", parameters=[ID], responses={
        (200, OCTET): OpenApiResponse(OpenApiTypes.BINARY, description="Neuroglancer's single annotation encoding"),
        304: NOT_MODIFIED, **FILE_ERRORS})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        layer = layer_of(request, kw, auth.READ)
        aid = parse_id(kw["id"], TOP, "the annotation id")
        row = layer.annotations.filter(aid=signed_id(aid)).values_list("record", flat=True).first()
        if row is None:
            raise NotFound(f"annotation {aid} is not in the layer")
        related: list[list[int]] = [[] for _ in layer.relationships]
        for rel, segment in AnnotationSegment.objects.filter(layer=layer, aid=signed_id(aid)).values_list(
                "relationship", "segment"):
            related[rel].append(unsigned_id(segment))
        return answer(with_relationships(bytes(row), [sorted(s) for s in related]), OCTET, request)


class RelationshipFile(PrecomputedView):
    @extend_schema(summary="The annotations related to one segment", parameters=[SEGMENT], responses={
        **BINARY, **FILE_ERRORS})
    def get(self, request: Any, **kw: Any) -> HttpResponse:
        layer, index = served(request, kw)
        if kw["relationship"] not in layer.relationships:
            raise NotFound(f"the layer has no relationship {kw['relationship'][:64]!r}")
        segment = parse_id(kw["segment"], TOP, "the segment id")
        signed = AnnotationSegment.objects.filter(
            layer=layer, relationship=layer.relationships.index(kw["relationship"]),
            segment=signed_id(segment)).values_list("aid", flat=True)
        rows = index.rows_of(np.array(list(signed), np.int64).view(np.uint64))
        return answer(annotation_list(index.records[rows], index.ids[rows]), OCTET, request)


@extend_schema(summary="Any other file of an annotation layer", responses=errors(401, 404, 429, meanings={
    404: "no such file; the message lists the files a layer has"}))
class NoSuchFile(PrecomputedView):
    def get(self, request: Any, **kw: Any) -> Response:
        raise NotFound(f"no such annotation file: {kw.get('rest', '')!r}; a layer has "
                       "/precomputed-annotations/{collection}/{experiment}/{layer}/info, "
                       ".../spatial{level}/{x}_{y}_{z}, .../by_id/{id} and .../rel_{relationship}/{segment}")


# Tails under /precomputed-annotations/{collection}/{experiment}/{layer}/, mounted by ndstore.api.urls.
ROUTES: list[tuple[str, type[PrecomputedView]]] = [
    ("info", InfoFile), ("spatial<int:level>/<int:x>_<int:y>_<int:z>", SpatialFile), ("by_id/<str:id>", ByIdFile),
    ("rel_<str:relationship>/<str:segment>", RelationshipFile)]
