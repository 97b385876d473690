"""`/v1/ingest/`: tile-ingest jobs. Creating one needs write permission on its channel.

The upload client (`ndstore ingest`) holds no credentials of the pipeline's queues, bucket or
tile index: it works through these routes, as the job's creator (or an admin of its channel):
    POST /v1/ingest/{id}/tasks/         lease upload tasks: {"max": n} -> {"tasks": [{tile, receipt}]}
    POST /v1/ingest/{id}/uploads/       {"tiles": [{tile, receipt, sha256, size}]} -> a PUT per leased tile
    POST /v1/ingest/{id}/tasks/failed/  {"tasks": [{tile, receipt, error}]}: leased tiles it could not send
The receipt of a lease is the caller's alone and ends with the lease: a URL is given, and a failure
taken, only for a task the caller holds on lease now (400 otherwise).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, lookups, scopes
from ndstore.api.media import read_capped_body
from ndstore.api.models import IngestJob
from ndstore.api.schema import TOKEN_REQUIRED, binary, errors
from ndstore.core.errors import Conflict, InvalidRequest, NDStoreError, NotFound, PayloadTooLarge
from ndstore.core.geometry import Box, check_inside
from ndstore.core.tiles import TILE_FORMATS
from ndstore.engine.ingest import (
    LEAVE,
    MAX_LEASE,
    PHASES,
    RECEIPT,
    SHA256,
    SIGNATURE,
    SIZE,
    Lease,
    TileUpload,
    tile_ref,
)
from ndstore.engine.ingest import IngestJob as JobSpec
from ndstore.wiring import services

BOX_FIELDS = ("x_start", "x_stop", "y_start", "y_stop", "z_start", "z_stop")
MAX_VISIBILITY_S = 43200  # SQS's longest visibility timeout (12 h); 0 would lease nothing

# The OpenAPI description of the job and of the upload client's bodies.
SPAN = serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2,
                             help_text="half-open [start, stop]")
COUNT = serializers.IntegerField()
TILE = serializers.ListField(child=serializers.IntegerField(min_value=0), min_length=4, max_length=4,
                             help_text="[t, z, y index, x index]")
RECEIPT_FIELD = serializers.CharField(help_text="the receipt its lease came with (yours alone, until the lease ends)")
QUEUE = inline_serializer("IngestQueue", {"waiting": COUNT, "in_flight": COUNT,
                                         "failed": serializers.IntegerField(help_text="dead-letter tasks")})
STATUS = inline_serializer("IngestStatus", {
    "tiles": inline_serializer("IngestTiles", {name: COUNT for name in ("total", "uploaded", "queued_for_upload")}),
    "supercuboids": inline_serializer("IngestSupercuboids", {name: COUNT for name in ("total", "built", "cleaned")}),
    "queues": inline_serializer("IngestQueues", {phase: QUEUE for phase in PHASES}),
    "failed_tiles": inline_serializer("FailedTile", {"key": serializers.CharField(), "error": serializers.CharField()},
                                      many=True, help_text="up to 50 of the upload queue's dead-letter tiles"),
}, required=False, help_text="GET /v1/ingest/{job_id}/ while the job uploads")
JOB = inline_serializer("IngestJob", {
    "id": serializers.IntegerField(), "state": serializers.ChoiceField(choices=IngestJob.STATES),
    "collection": serializers.CharField(), "experiment": serializers.CharField(), "channel": serializers.CharField(),
    "datatype": serializers.CharField(),
    "box": inline_serializer("IngestBox", {axis: SPAN for axis in "xyz"}, help_text="voxels at resolution 0"),
    "t": SPAN,
    "tile_size": inline_serializer("TileSize", {"x": COUNT, "y": COUNT}),
    "file_format": serializers.ChoiceField(choices=sorted(set(TILE_FORMATS.values()))),
    "created": serializers.DateTimeField(), "finished": serializers.DateTimeField(allow_null=True),
    "tile_count": COUNT,
    "queues": inline_serializer("IngestQueueNames", {phase: serializers.CharField() for phase in PHASES}),
    "status": STATUS,
})
NEW_JOB = inline_serializer("NewIngestJob", {
    **{name: serializers.CharField() for name in ("collection", "experiment", "channel")},
    **{name: serializers.IntegerField(min_value=0, help_text="voxels at resolution 0, half-open")
       for name in BOX_FIELDS},
    **{name: serializers.IntegerField(min_value=1, help_text="divides the channel's supercuboid extent")
       for name in ("tile_size_x", "tile_size_y")},
    "t_start": serializers.IntegerField(min_value=0, default=0),
    "t_stop": serializers.IntegerField(min_value=1, default=1),
    "file_format": serializers.ChoiceField(choices=list(TILE_FORMATS), default="png", help_text="any case"),
    "visibility_timeout_s": serializers.IntegerField(
        min_value=1, max_value=MAX_VISIBILITY_S, required=False,
        help_text="how long a lease lasts: its task stays hidden and its upload URLs work that long, "
                  "in seconds (default: the service's)"),
})
JOB_ERRORS = {404: "no such ingest job", 409: "the job is not uploading"}
UPLOADER = "For the job's creator or an admin of its channel, while the job uploads."
LEASED = (f"{UPLOADER} Only for tasks the caller holds on lease now (POST /v1/ingest/{{job_id}}/tasks/): a receipt "
          "that is another's, forged, or whose lease ended is refused (400).")


def _leased(name: str, **fields: serializers.Field) -> serializers.ListSerializer:
    return inline_serializer(name, {"tile": TILE, "receipt": RECEIPT_FIELD, **fields}, many=True,
                             min_length=1, max_length=MAX_LEASE)


def _int(data: dict[str, Any], name: str, default: int | None = None, low: int = 0, high: int | None = None) -> int:
    value = data.get(name, default)
    allowed = f"from {low} to {high}" if high is not None else f">= {low}"
    if value is None:
        raise InvalidRequest(f"{name} is required" + (f": {name} must be an integer {allowed}" if high else ""))
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise InvalidRequest(f"{name} must be an integer {allowed}, not {value!r}"[:200])
    return value


def spec_of(job: IngestJob) -> JobSpec:
    return JobSpec(job.id, lookups.channel_volume(job.channel),
                   ((job.x_start, job.y_start, job.z_start), (job.x_stop, job.y_stop, job.z_stop)),
                   job.tile_size_x, job.tile_size_y, job.t_start, job.t_stop, job.file_format,
                   services().ingest.queue_prefix)


def describe(job: IngestJob, with_status: bool) -> dict[str, Any]:
    ingest = services().ingest
    spec = spec_of(job)
    chan = job.channel
    body: dict[str, Any] = {
        "id": job.id, "state": job.state,
        "collection": chan.experiment.collection.name, "experiment": chan.experiment.name, "channel": chan.name,
        "datatype": chan.datatype,
        "box": {"x": [job.x_start, job.x_stop], "y": [job.y_start, job.y_stop], "z": [job.z_start, job.z_stop]},
        "t": [job.t_start, job.t_stop], "tile_size": {"x": job.tile_size_x, "y": job.tile_size_y},
        "file_format": job.file_format, "created": job.created.isoformat(),
        "finished": job.finished.isoformat() if job.finished else None,
        "tile_count": spec.layout.tile_count(), "queues": {p: spec.queue(p) for p in PHASES},
    }
    if with_status and job.state == "uploading":
        body["status"] = ingest.status(spec)
    return body


def _path(job: IngestJob) -> str:
    chan = job.channel
    return f"{chan.experiment.collection.name}/{chan.experiment.name}/{chan.name}"


def _job(job_id: int, request: Any, level: int = auth.WRITE) -> IngestJob:
    job = IngestJob.objects.select_related("channel__experiment__collection").filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"ingest job {job_id} does not exist")
    chan = job.channel
    auth.require(request.user, level, chan.experiment.collection, chan.experiment, chan)
    return job


def _uploading(job_id: int, request: Any) -> tuple[IngestJob, JobSpec]:
    """The job, for its uploader: its creator, or an admin of its channel; while it uploads."""
    job = _job(job_id, request)
    chan = job.channel
    if job.creator_id != request.user.pk and auth.access_level(
            request.user, chan.experiment.collection, chan.experiment, chan) < auth.ADMIN:
        raise exceptions.PermissionDenied(f"ingest job {job_id} is not yours: only its creator or an admin of "
                                          f"{_path(job)} may upload its tiles")
    if job.state != "uploading":
        raise Conflict(f"ingest job {job_id} is {job.state}; it takes no more tiles")
    return job, spec_of(job)


def _items(request: Any, name: str, limit: int) -> list[dict[str, Any]]:
    items = request.data.get(name) if isinstance(request.data, dict) else None
    if not isinstance(items, list) or not 1 <= len(items) <= limit or not all(isinstance(i, dict) for i in items):
        raise InvalidRequest(f"the body must be a JSON object whose {name!r} is a list of 1 to {limit} objects")
    return items


def _text(item: dict[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(f"each item needs {name!r} as a string")
    return value


def _size(item: dict[str, Any]) -> int:
    value = item.get("size")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest("each item needs 'size': the tile file's length in bytes, a positive integer")
    return value


def _uploader(request: Any) -> str:
    """Who leases and uploads, as the pipeline names them (its leave on a job is revoked when
    its write permission goes: ndstore.api.ingest_leaves)."""
    return str(request.user.pk)


class IngestJobList(APIView):
    @extend_schema(summary="List ingest jobs",
                   description="Yours (everyone's for staff), newest first, at most 100; a scoped token's: those "
                               "inside its scope.",
                   auth=TOKEN_REQUIRED,
                   responses={200: inline_serializer("IngestJobs", {"jobs": type(JOB)(many=True)}),  # JOB, as a list
                              **errors(401, 429)})
    def get(self, request: Any) -> Response:
        """The caller's jobs, newest first (everyone's for staff)."""
        auth.require_login(request.user, "list ingest jobs")
        jobs = IngestJob.objects.select_related("channel__experiment__collection").order_by("-id")
        if not request.user.is_staff:  # a scoped token's user is not staff (scopes.py)
            jobs = jobs.filter(creator=request.user)
        if (scope := scopes.of(request.user)) is not None:
            jobs = jobs.filter(scope.channels("channel__"))
        return Response({"jobs": [describe(j, with_status=False) for j in jobs[:100]]})

    @extend_schema(
        summary="Create an ingest job",
        description="Needs write permission on the channel. The box lies in the frame and starts on the tile grid; "
                    "each refusal names the field and the rule.",
        request=NEW_JOB,
        responses={201: JOB, **errors(400, 401, 403, 404, 413, 415, 503)})
    def post(self, request: Any) -> Response:
        auth.require_some_grant(request.user, auth.WRITE, "create an ingest job")
        data = request.data if isinstance(request.data, dict) else {}
        if not data:
            raise InvalidRequest("the body must be a JSON object with collection, experiment, channel, "
                                 "x_start..z_stop, tile_size_x, tile_size_y")
        names = [data.get(k) for k in ("collection", "experiment", "channel")]
        if not all(isinstance(n, str) and n for n in names):
            raise InvalidRequest("collection, experiment and channel are required (names)")
        coll, exp, chan = lookups.channel_path(*names)
        auth.require(request.user, auth.WRITE, coll, exp, chan)
        box = {k: _int(data, k) for k in BOX_FIELDS}
        fmt = str(data.get("file_format", "png")).lower()
        if fmt not in TILE_FORMATS:
            raise InvalidRequest(f"file_format {fmt!r} is not one of png, tif, tiff")
        fields = {**box, "t_start": _int(data, "t_start", 0), "t_stop": _int(data, "t_stop", 1, low=1),
                  "tile_size_x": _int(data, "tile_size_x", low=1), "tile_size_y": _int(data, "tile_size_y", low=1),
                  "file_format": TILE_FORMATS[fmt]}
        region = Box.from_ranges((box["x_start"], box["x_stop"]), (box["y_start"], box["y_stop"]),
                                 (box["z_start"], box["z_stop"]))
        volume = lookups.channel_volume(chan)
        check_inside(region, volume.extent(0))
        if fields["t_stop"] > volume.num_time_samples or fields["t_start"] >= fields["t_stop"]:
            raise InvalidRequest(f"time range {fields['t_start']}:{fields['t_stop']} is not inside the "
                                 f"experiment's 0:{volume.num_time_samples}")
        visibility = _int(data, "visibility_timeout_s", services().config.ingest_visibility_s, low=1,
                          high=MAX_VISIBILITY_S)
        job = IngestJob(channel=chan, creator=request.user, **fields)
        spec = spec_of(job)
        spec.layout.validate()
        audit.record(request, action="create", channel="/".join(names), box=[[box[f"{a}_start"], box[f"{a}_stop"]]
                                                                              for a in "xyz"])
        _create(job, visibility)
        return Response(describe(job, with_status=False), status=201)


def _create(job: IngestJob, visibility_s: int) -> None:
    """Save the job and create its record and queues; if that fails, neither stays behind
    (the row is deleted, what was created of the pipeline's part is stopped and removed)."""
    job.save()
    ingest, spec = services().ingest, spec_of(job)
    try:
        ingest.create(spec, visibility_s, services().config.ingest_notify_queue)
    except BaseException:
        job.state = "cancelled"  # what is left of the pipeline's part is stopped below, not by the delete's signal
        job.delete()
        try:
            ingest.stop(spec, delete_tiles=False)
        except NDStoreError:
            pass  # the pipeline is unreachable: nothing of the job can have been uploaded either
        raise


class IngestJobView(APIView):
    @extend_schema(summary="An ingest job and, while it uploads, its status", auth=TOKEN_REQUIRED,
                   responses={200: JOB, **errors(401, 403, 404, 429, 503, meanings=JOB_ERRORS)})
    def get(self, request: Any, job_id: int) -> Response:
        return Response(describe(_job(job_id, request), with_status=True))

    @extend_schema(summary="Cancel an ingest job",
                   responses={204: OpenApiResponse(None, description="cancelled"),
                              **errors(401, 403, 404, 409, 503, meanings=JOB_ERRORS)})
    def delete(self, request: Any, job_id: int) -> Response:
        """Cancel: the job stops at once (its tiles are refused from now on) and its queues go;
        its tiles and index rows are removed in the background. Supercuboids already built stay."""
        job = _job(job_id, request)
        if job.state != "uploading":
            raise Conflict(f"ingest job {job_id} is {job.state} already")
        audit.record(request, action="cancel", job=job.id, channel=_path(job))
        services().ingest.stop(spec_of(job), delete_tiles=True)
        job.state, job.finished = "cancelled", timezone.now()
        job.save(update_fields=["state", "finished"])
        return Response(status=204)


class IngestJobComplete(APIView):
    @extend_schema(summary="Complete an ingest job", request=None, responses={
        200: JOB, **errors(401, 403, 404, 409, 503, meanings={
            **JOB_ERRORS, 409: "the job is not uploading, or not finished: the message says what is left"})})
    def post(self, request: Any, job_id: int) -> Response:
        """Finish a job whose every supercuboid is built and cleaned; 409 naming what is left."""
        job = _job(job_id, request)
        if job.state != "uploading":
            raise Conflict(f"ingest job {job_id} is {job.state} already")
        spec = spec_of(job)
        status = services().ingest.status(spec)
        sc, tiles = status["supercuboids"], status["tiles"]
        failed = sum(q["failed"] for q in status["queues"].values())
        if failed or sc["cleaned"] < sc["total"]:
            raise Conflict(f"ingest job {job_id} is not finished: {tiles['uploaded']} of {tiles['total']} tiles "
                           f"uploaded, {sc['built']} of {sc['total']} supercuboids built, {sc['cleaned']} cleaned, "
                           f"{failed} tasks failed (see GET /v1/ingest/{job_id}/; POST .../retry/ requeues failures)")
        audit.record(request, action="complete", job=job.id, channel=_path(job))
        services().ingest.stop(spec, delete_tiles=False)
        job.state, job.finished = "complete", timezone.now()
        job.save(update_fields=["state", "finished"])
        return Response(describe(job, with_status=False))


class IngestTasks(APIView):
    @extend_schema(
        summary="Lease upload tasks", description=UPLOADER,
        request=inline_serializer("TaskLease", {"max": serializers.IntegerField(
            min_value=1, max_value=MAX_LEASE, default=10, help_text="how many tasks at most")}),
        responses={200: inline_serializer("Leases", {
                       "tasks": _leased("Lease"),
                       **{name: COUNT for name in ("total", "queued", "waiting", "leased")},
                       "done": serializers.BooleanField(help_text="every task was queued and none is left")}),
                   **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings=JOB_ERRORS)})
    def post(self, request: Any, job_id: int) -> Response:
        """Lease up to `max` upload tasks of the job (hidden from other uploaders for the queue's
        visibility timeout); `done` once every task is queued and none waits or is in flight."""
        _, spec = _uploading(job_id, request)
        count = request.data.get("max", 10) if isinstance(request.data, dict) else 10
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_LEASE:
            raise InvalidRequest(f"max must be an integer from 1 to {MAX_LEASE}")
        ingest = services().ingest
        leases = ingest.lease(spec, count, _uploader(request))
        progress = ingest.upload_progress(spec)
        return Response({"tasks": [{"tile": [lease.tile.t, lease.tile.z, lease.tile.y_index, lease.tile.x_index],
                                    "receipt": lease.receipt} for lease in leases], **progress})


class IngestUploads(APIView):
    @extend_schema(
        summary="Presigned PUTs for leased tiles", description=LEASED,
        request=inline_serializer("TileUploads", {"tiles": _leased(
            "TileUpload", sha256=serializers.RegexField(r"^[0-9a-f]{64}$",
                                                         help_text="SHA-256 of the tile's content, lowercase hex"),
            size=serializers.IntegerField(min_value=1, help_text="the tile file's length in bytes: at most twice "
                                                                 "the tile's voxels plus 64 KiB"))}),
        responses={200: inline_serializer("UploadTargets", {"uploads": inline_serializer("UploadTarget", {
                       "tile": TILE, "method": serializers.ChoiceField(choices=["PUT"]),
                       "url": serializers.CharField(help_text="works until the tile's lease ends (an hour at most), "
                                                              "for this tile's key and size only"),
                       "headers": serializers.DictField(child=serializers.CharField(),
                                                        help_text="to send exactly, with the PUT")}, many=True)}),
                   **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings={
                       **JOB_ERRORS, 413: "a tile's size is over its job's bound"})})
    def post(self, request: Any, job_id: int) -> Response:
        """A PUT per leased tile, for the content whose SHA-256 and size the uploader names."""
        _, spec = _uploading(job_id, request)
        uploads = [TileUpload(tile_ref(i.get("tile")), _text(i, "receipt"), _text(i, "sha256"), _size(i))
                   for i in _items(request, "tiles", MAX_LEASE)]
        targets = services().ingest.grant_uploads(spec, uploads, _uploader(request))
        return Response({"uploads": [{"tile": i["tile"], "method": "PUT", "url": t.url, "headers": t.headers}
                                     for i, t in zip(request.data["tiles"], targets)]})


class IngestFailedTasks(APIView):
    @extend_schema(
        summary="Report tiles that could not be sent", description=LEASED,
        request=inline_serializer("FailedTasks", {"tasks": _leased("FailedTask", error=serializers.CharField(
            help_text="what went wrong (kept to 1000 characters)"))}),
        responses={200: inline_serializer("FailedCount", {"failed": COUNT}),
                   **errors(400, 401, 403, 404, 409, 413, 415, 503, meanings=JOB_ERRORS)})
    def post(self, request: Any, job_id: int) -> Response:
        """Tiles the uploader could not read or that failed its checks, with the reason."""
        _, spec = _uploading(job_id, request)
        failures = [(Lease(tile_ref(i.get("tile")), _text(i, "receipt")), _text(i, "error"))
                    for i in _items(request, "tasks", MAX_LEASE)]
        return Response({"failed": services().ingest.report_failed(spec, failures, _uploader(request))})


class IngestJobRetry(APIView):
    @extend_schema(summary="Requeue an ingest job's failed tasks", request=None,
                   responses={200: inline_serializer("Requeued", {"requeued": COUNT}),
                              **errors(401, 403, 404, 409, 503, meanings=JOB_ERRORS)})
    def post(self, request: Any, job_id: int) -> Response:
        """Move the job's failed tasks from the dead-letter queues back to their queues."""
        job = _job(job_id, request)
        if job.state != "uploading":
            raise Conflict(f"ingest job {job_id} is {job.state}")
        audit.record(request, action="retry", job=job.id, channel=_path(job))
        return Response({"requeued": services().ingest.retry_failed(spec_of(job))})


class LocalTileUpload(APIView):
    """`PUT /v1/ingest/tiles/{key}?expires=&size=&signature=`: the local tile store's presigned
    PUT (where no S3 takes them). Before the body is read: the signature the service gave with
    the leave to upload (key, metadata headers, size, expiry), a Content-Length of that size, and
    that the job is live and the uploader's leave on it stands. Then exactly that many bytes."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes: list[Any] = []
    _signed_size = 0

    def max_body_bytes(self) -> int:
        return self._signed_size

    def body_limit(self, request: Any, kw: dict[str, Any]) -> int:
        """What may be read of the body (the front asks before it reads it): the signed size,
        once the leave, the declared length and the job are checked."""
        return self._leave(request, kw["key"])[2]

    @staticmethod
    def _leave(request: Any, key: str) -> tuple[Any, dict[str, str], int]:
        """The tile store, the upload's metadata headers and its signed size, once the leave to
        upload (signature, expiry), the declared Content-Length and the job's standing are checked."""
        store = services().ingest_stores.uploads
        if store is None:
            raise NotFound("this service's tile store takes uploads at its own URLs (presigned S3 PUTs), not here")
        meta = {name.removeprefix("HTTP_X_AMZ_META_").lower().replace("_", "-"): value
                for name, value in request.META.items() if name.startswith("HTTP_X_AMZ_META_")}
        query = request.GET
        size = store.check_leave(key, query.get("expires", ""), query.get("size", ""), query.get("signature", ""),
                                 meta)
        _check_length(request, key, size)
        services().ingest.check_upload(key, meta)
        return store, meta, size

    @extend_schema(
        summary="Upload a tile (local tile store)",
        description="The URL and headers come from POST /v1/ingest/{job_id}/uploads/; the body is the tile file as "
                    "it is (PNG or TIFF), with any Content-Type.",
        parameters=[OpenApiParameter("key", str, OpenApiParameter.PATH, description="the tile's key"),
                    *[OpenApiParameter(name, str, required=True, description="from the upload URL")
                      for name in ("expires", "size", "signature")],
                    *[OpenApiParameter(f"x-amz-meta-{name}", str, OpenApiParameter.HEADER, required=True,
                                       description="from the upload's headers")
                      for name in (RECEIPT, SHA256, SIZE, LEAVE, SIGNATURE)]],
        request=binary(["*/*"]),
        responses={200: OpenApiResponse(None, description="stored; empty body"), **errors(
            400, 401, 403, 404, 409, 411, 413, 503, meanings={
                400: "the Content-Length is not the size the URL was signed for",
                401: "the URL has no signature (and no token was sent)",
                403: "the signature does not match this key, these headers, size and expiry, or has expired",
                404: "this service's tile store takes uploads at its own URLs (presigned S3 PUTs), not here",
                409: "the job was stopped (cancelled, completed) or the uploader's leave on it revoked",
                411: "no Content-Length",
                413: "the Content-Length is over the size the URL was signed for"})})
    def put(self, request: Any, key: str) -> Response:
        store, meta, self._signed_size = self._leave(request, key)
        body = read_capped_body(request._request, self, request._request)
        if len(body) != self._signed_size:
            raise InvalidRequest(f"the upload of {key} sent {len(body)} bytes of the {self._signed_size} it declared")
        store.put(key, body, meta)
        return Response(status=200)


class LengthRequired(exceptions.APIException):
    status_code = 411
    default_code = "length_required"


def _check_length(request: Any, key: str, size: int) -> None:
    """The declared Content-Length is the signed size (before a byte of the body is read)."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    if not declared.isdigit():
        raise LengthRequired(f"the upload of {key} must declare its Content-Length ({size} bytes)")
    if int(declared) > size:
        raise PayloadTooLarge(f"the upload of {key} declares {declared} bytes; its URL was signed for {size}")
    if int(declared) != size:
        raise InvalidRequest(f"the upload of {key} declares {declared} bytes; its URL was signed for {size}")
