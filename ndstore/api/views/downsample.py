"""`/v1/downsample/{c}/{e}/{ch}/`: build a channel's resolution hierarchy (Boss v1 shapes).

POST (admin on the channel) starts a build of every level through SQS; GET reports the Boss
fields (levels, cuboid size, extent and voxel size per level, status) and the build's progress per
level; DELETE cancels a build in progress.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from ndstore.api import audit, auth, levels, lookups
from ndstore.api.models import Channel, DownsampleJob
from ndstore.api.schema import errors
from ndstore.core.errors import Conflict
from ndstore.engine.downsample import DownsampleJob as RunSpec
from ndstore.wiring import services


def _spec(job: DownsampleJob) -> RunSpec:
    return RunSpec(job.id, lookups.channel_volume(job.channel), services().config.ingest_queue_prefix)


def _current(chan: Channel) -> DownsampleJob | None:
    return chan.downsample_jobs.order_by("-id").first()  # type: ignore[no-any-return]


def _refresh(job: DownsampleJob) -> dict[str, Any]:
    """The run's progress; a run that finished or failed updates the job and the channel."""
    progress = services().downsample_runs.status(_spec(job))
    if job.state == "IN_PROGRESS" and progress["state"] in ("DOWNSAMPLED", "FAILED"):
        job.state, job.finished = progress["state"], timezone.now()
        job.save(update_fields=["state", "finished"])
        job.channel.downsample_status = progress["state"]
        job.channel.save(update_fields=["downsample_status"])
        if progress["state"] == "DOWNSAMPLED":
            levels.note_hierarchy_built(lookups.channel_volume(job.channel))
            services().downsample_runs.remove(_spec(job))
    return progress


def describe(chan: Channel) -> dict[str, Any]:
    volume = lookups.channel_volume(chan)
    frame = chan.experiment.coord_frame
    every = range(volume.num_levels)  # the Boss's geometry of every declared level, built or not
    body: dict[str, Any] = {
        "num_hierarchy_levels": volume.num_levels,
        "built_levels": levels.built_levels(chan, volume),
        "cuboid_size": {str(r): list(volume.grid(r).cuboid) for r in every},
        "extent": {str(r): list(volume.extent(r).shape_zyx[::-1]) for r in every},
        "voxel_size": {str(r): [frame.x_voxel_size * 2 ** r, frame.y_voxel_size * 2 ** r,
                                frame.z_voxel_size * (2 ** r if volume.method == "isotropic" else 1)]
                       for r in every},
        "status": chan.downsample_status,
    }
    job = _current(chan)
    if job is not None:
        progress = _refresh(job) if job.state == "IN_PROGRESS" else None
        body["status"] = chan.downsample_status
        body["job"] = {"id": job.id, "state": job.state, "created": job.created.isoformat(),
                       "finished": job.finished.isoformat() if job.finished else None,
                       **({"levels": progress["levels"], "queue": progress["queue"]} if progress else {})}
    return body


def _per_level(child: serializers.Field, what: str, required: bool = True) -> serializers.DictField:
    return serializers.DictField(child=child, required=required,
                                 help_text=f'{what}, by resolution level: {{"0": ..., "1": ...}}')


def _xyz(number: serializers.Field) -> serializers.ListField:
    return serializers.ListField(child=number, min_length=3, max_length=3)


HIERARCHY = inline_serializer("Hierarchy", {
    "num_hierarchy_levels": serializers.IntegerField(help_text="declared by the experiment"),
    "built_levels": serializers.ListField(child=serializers.IntegerField(),
                                          help_text="the levels that hold data: the base, every level once a build "
                                                    "finished, and levels clients wrote (`status` is DOWNSAMPLED "
                                                    "only after a build: Neuroglancer's boss source then shows "
                                                    "every level, else the base only)"),
    "cuboid_size": _per_level(_xyz(serializers.IntegerField()), "[x, y, z] voxels of a cuboid"),
    "extent": _per_level(_xyz(serializers.IntegerField()), "[x, y, z] voxels of the level"),
    "voxel_size": _per_level(_xyz(serializers.FloatField()), "[x, y, z] voxel size, in the coordinate frame's unit"),
    "status": serializers.ChoiceField(choices=["NOT_DOWNSAMPLED", "IN_PROGRESS", "DOWNSAMPLED", "FAILED"]),
    "job": inline_serializer("DownsampleJob", {
        "id": serializers.IntegerField(),
        "state": serializers.ChoiceField(choices=DownsampleJob.STATES),
        "created": serializers.DateTimeField(), "finished": serializers.DateTimeField(allow_null=True),
        "levels": _per_level(inline_serializer("LevelProgress", {
            name: serializers.IntegerField() for name in ("total", "done", "failed")}),
            "tasks of each level (while the build runs)", required=False),
        "queue": inline_serializer("QueueDepth", {"waiting": serializers.IntegerField(),
                                                  "in_flight": serializers.IntegerField()},
                                   required=False, help_text="while the build runs"),
    }, required=False, help_text="the latest build, if any"),
})


class DownsampleView(APIView):
    @extend_schema(summary="The channel's resolution hierarchy and its build",
                   responses={200: HIERARCHY, **errors(401, 403, 404, 429, 503)})
    def get(self, request: Any, collection: str, experiment: str, channel: str) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.READ, coll, exp, chan)
        return Response(describe(chan))

    @extend_schema(summary="Build every level from the base", description="Needs admin on the channel.",
                   request=None, responses={201: HIERARCHY, **errors(401, 403, 404, 409, 503, meanings={
                       409: "a build of the channel is in progress"})})
    def post(self, request: Any, collection: str, experiment: str, channel: str) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.ADMIN, coll, exp, chan)
        current = _current(chan)
        if current is not None and current.state == "IN_PROGRESS" and _refresh(current)["state"] == "IN_PROGRESS":
            raise Conflict(f"a downsample of {collection}/{experiment}/{channel} is in progress (job {current.id}); "
                           "DELETE it first to start over")
        services().index.require_fresh()  # the build lists each level's stored supercuboids
        audit.record(request, action="start", channel=f"{collection}/{experiment}/{channel}")
        with transaction.atomic():  # a build that could not start leaves no job in progress behind
            job = DownsampleJob.objects.create(channel=chan, creator=request.user)
            chan.downsample_status = "IN_PROGRESS"
            chan.save(update_fields=["downsample_status"])
            services().downsample_runs.start(_spec(job))
        return Response(describe(chan), status=201)

    @extend_schema(summary="Cancel the build in progress", request=None,
                   responses={204: OpenApiResponse(None, description="cancelled"), **errors(
                       401, 403, 404, 409, 503, meanings={409: "no build of the channel is in progress"})})
    def delete(self, request: Any, collection: str, experiment: str, channel: str) -> Response:
        coll, exp, chan = lookups.channel_path(collection, experiment, channel)
        auth.require(request.user, auth.ADMIN, coll, exp, chan)
        current = _current(chan)
        if current is None or current.state != "IN_PROGRESS":
            raise Conflict(f"no downsample of {collection}/{experiment}/{channel} is in progress")
        audit.record(request, action="cancel", channel=f"{collection}/{experiment}/{channel}", job=current.id)
        services().downsample_runs.remove(_spec(current))
        current.state, current.finished = "CANCELLED", timezone.now()
        current.save(update_fields=["state", "finished"])
        chan.downsample_status = "NOT_DOWNSAMPLED"
        chan.save(update_fields=["downsample_status"])
        return Response(status=204)
