"""What the OpenAPI description of the views (drf-spectacular, `/api/schema/`) shares: the JSON
error body, binary bodies, the token scheme, what the common path parameters mean, and operation
ids that stay unique where one view serves several routes, and the Range and ETag headers of the data
GETs (ndstore.api.browser_http). The hooks run from
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from ndstore.api.auth import TokenAuthentication

JSON = "application/json"
READ_METHODS = ("GET", "HEAD")


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = TokenAuthentication
    name = "TokenAuth"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <key>`; tokens are minted by `ndstore token --user NAME`"}

    def get_security_requirement(self, auto_schema: AutoSchema) -> list[dict[str, list[Any]]]:
        # Anyone may read a public collection; a change needs a token (RequestGate answers 401
        # before the view otherwise). Reads that need one say so with TOKEN_REQUIRED.
        if auto_schema.method in READ_METHODS:
            return [{"TokenAuth": []}, {}]
        return [{"TokenAuth": []}]


# For extend_schema(auth=...): a read that needs a token whatever the collection. (Its hint says
# Sequence[str]; drf-spectacular uses the value as the operation's security requirements.)
TOKEN_REQUIRED: Any = [{"TokenAuth": []}]


class ErrorSerializer(serializers.Serializer):
    """Every refusal and failure, in JSON whatever media type was asked for (ndstore.api.errors)."""

    status = serializers.IntegerField(help_text="the HTTP status code")
    message = serializers.CharField(help_text="what was refused or failed, and why")


MEANINGS = {
    400: "invalid URL, query or body; the message says what and why",
    401: "a token is needed and none was sent, or the Authorization header is malformed or its token unknown",
    403: "the token lacks the permission this needs",
    404: "something the request names does not exist",
    406: "the Accept header names no media type this route answers",
    409: "conflicts with the resource's current state",
    413: "the body is over its limit (JSON bodies: 1 MiB)",
    415: "the Content-Type is not one this route reads (JSON bodies: exactly application/json)",
    429: "too many anonymous reads from this address (NDSTORE_ANON_READ_RATE), or the caller's data GETs read as "
         "many bytes as its read budget allows for now (NDSTORE_ANON_READ_BYTES_*, NDSTORE_READ_BYTES_*); retry "
         "after Retry-After, or send a token",
    500: "stored data cannot be read back as it was written; an operator must look",
    503: "storage (a store, a lock, the audit log) is unavailable or not to be trusted now: nothing was changed; "
         "retry after Retry-After",
    507: "the base tier's disk is full: nothing was stored",
}


def errors(*codes: int, meanings: Mapping[int, str] | None = None) -> dict[tuple[int, str], OpenApiResponse]:
    """The JSON error body under each code; `meanings` says more than MEANINGS where a route can."""
    said = {**MEANINGS, **(meanings or {})}
    return {(code, JSON): OpenApiResponse(ErrorSerializer, description=said[code]) for code in codes}


def binary(media_types: Iterable[str]) -> dict[str, Any]:
    """A request body of raw bytes in any of `media_types`."""
    return {media: OpenApiTypes.BINARY for media in media_types}


def binary_responses(code: int, media_types: Iterable[str], description: str) -> dict[tuple[int, str],
                                                                                      OpenApiResponse]:
    return {(code, media): OpenApiResponse(OpenApiTypes.BINARY, description=description) for media in media_types}


# The path parameters many routes share; their types and patterns come from the routes'
# converters. An axis is a half-open range (the `range` converter) or one plane (`int`).
PATH_PARAMETERS = {
    "collection": "collection name",
    "experiment": "experiment name, in the collection",
    "channel": "channel name, in the experiment",
    "name": "the resource's name",
    "resolution": "resolution level, 0 the finest",
    "encoding": "raw or compressed_segmentation, instead of the channel's default",
    "job_id": "the ingest job's id",
    "rest": "the rest of a path that matches none of this prefix's routes",
}
AXIS_RANGE = "half-open {0}0:{0}1, in voxels of the level, e.g. 0:512"
AXIS_PLANE = "the plane's {0}, in voxels of the level"
TIME_RANGE = "half-open t0:t1 of time samples: the array gains a leading t axis"
TIME_SAMPLE = "time sample (without it: the channel's default_time_sample)"


def _path_parameter_doc(name: str, schema: Mapping[str, Any]) -> str | None:
    one_plane = schema.get("type") == "integer"
    if name in ("x", "y", "z"):
        return (AXIS_PLANE if one_plane else AXIS_RANGE).format(name)
    if name == "t":
        return TIME_SAMPLE if one_plane else TIME_RANGE
    return PATH_PARAMETERS.get(name)


def describe_path_parameters(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """Gives the shared path parameters their meaning where a view did not describe them."""
    for operations in result["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                doc = _path_parameter_doc(parameter["name"], parameter["schema"])
                if parameter["in"] == "path" and doc and "description" not in parameter:
                    parameter["description"] = doc
    return result


ACTIONS = {"get": "retrieve", "post": "create", "put": "update", "patch": "partial_update", "delete": "destroy"}
_ACTION = re.compile(rf"_(?:list|{'|'.join(ACTIONS.values())})$")


def _path_words(path: str) -> list[str]:
    """`/v1/meta/{collection}/{experiment}/` -> meta, collection, experiment."""
    prefix = (spectacular_settings.SCHEMA_PATH_PREFIX or "").lstrip("^")
    words: list[str] = []
    for segment in re.sub(f"^{prefix}", "", path).lstrip("/").removesuffix("/").split("/"):
        word = segment.strip("{}").replace("-", "_") or "empty"  # `/v1/collection//`: intern's collection list
        if not words or word != words[-1]:  # `collection/{collection}` says it once
            words.append(word)
    return words


def distinct_operation_ids(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """drf-spectacular names an operation after its path less the parameters, so routes that differ
    only in those collide: an optional time range or encoding, the form without a trailing slash
    that intern asks for, a catch-all that explains malformed URLs. All the operations of such
    routes are named after their whole path instead (and `without_slash` where that is the difference)."""
    paths_by_stem: dict[str, list[str]] = defaultdict(list)
    for path, operations in result["paths"].items():
        paths_by_stem[_ACTION.sub("", next(iter(operations.values()))["operationId"])].append(path)
    for paths in (paths for paths in paths_by_stem.values() if len(paths) > 1):
        names = {path: "_".join(_path_words(path)) for path in paths}
        for path in paths:
            if not path.endswith("/") and f"{path}/" in names:
                names[path] += "_without_slash"
            for method, operation in result["paths"][path].items():
                operation["operationId"] = f"{names[path]}_{ACTIONS[method]}"
    return result


RANGE_HEADERS = [
    {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "one range, `bytes=a-b`, `bytes=a-` or `bytes=-n`: 206 with those bytes of the body (several "
                    "ranges or a malformed header: the whole body)"},
    {"name": "If-Range", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "an ETag: the range only while the body still has it, else the whole body"},
    {"name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "ETags the client holds: 304 while the body still has one of them"},
]


def describe_browser_http(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """The data GETs answer Range, If-Range and If-None-Match (ndstore.api.browser_http): their
    headers and the 206, 304 and 416 answers, on every operation that answers 200 with a body."""
    from ndstore.api.browser_http import is_data_path

    for path, operations in result["paths"].items():
        operation = operations.get("get")
        if not is_data_path(path) or operation is None or "200" not in operation.get("responses", {}):
            continue
        ok = operation["responses"]["200"]
        ranged = set(ok.get("content", {})) != {JSON}  # JSON documents are sent whole
        known = {p["name"] for p in operation.get("parameters", [])}
        operation.setdefault("parameters", []).extend(
            h for h in RANGE_HEADERS if h["name"] not in known and (ranged or h["name"] == "If-None-Match"))
        responses = operation["responses"]
        responses.setdefault("304", {"description": "not modified: the If-None-Match ETag still holds"})
        if ranged:
            responses["206"] = {**ok, "description": "the bytes of the Range asked for, with Content-Range"}
            error = {"content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}
            responses["416"] = {**error, "description": "the range starts past the end of the body"}
    return result
