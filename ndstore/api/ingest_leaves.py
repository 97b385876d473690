"""An uploader's leave on an ingest job stands only while it may upload there.

The ingest handlers run without Django (lambdas/), so they cannot ask who holds which grant:
they ask the tile index whether the leave a tile was uploaded under still stands
(ndstore.engine.ingest). This module keeps that record current. Every change that can take write
permission away (a grant saved or deleted, a user saved or deleted) looks at the live jobs it can
touch (a grant's: those in its collection; a user's: all) and revokes the leave of each of their
uploaders that may no longer upload: not active, below write on the channel, or neither the
job's creator nor an admin of its channel. An ingest job deleted while uploading is stopped.

It runs inside the change's transaction: the permission views wrap their grant changes in one,
so a revocation that cannot reach the tile index fails whole (503) and can be tried again,
rather than leaving uploads going that the permission no longer allows.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.db.models.signals import post_delete, post_save

from ndstore.api import auth
from ndstore.api.models import Grant, IngestJob
from ndstore.core.errors import NotFound
from ndstore.wiring import services


def connect() -> None:
    for model in (Grant, get_user_model()):
        post_save.connect(_permission_changed, sender=model, dispatch_uid=f"ingest-leaves-save-{model.__name__}")
        post_delete.connect(_permission_changed, sender=model, dispatch_uid=f"ingest-leaves-delete-{model.__name__}")
    post_delete.connect(_job_deleted, sender=IngestJob, dispatch_uid="ingest-leaves-job-deleted")


def _permission_changed(sender: Any, instance: Any, created: bool = False, update_fields: Any = None,
                        **_: Any) -> None:
    if not isinstance(instance, Grant) and (created or (update_fields and set(update_fields) == {"last_login"})):
        return  # a new user holds no leave; a login changes no permission
    live = IngestJob.objects.filter(state="uploading")
    if isinstance(instance, Grant):
        revoke_lapsed(live.filter(channel__experiment__collection_id=instance.collection_id), instance.user_id)
    else:
        revoke_lapsed(live, instance.pk)


def revoke_lapsed(jobs: QuerySet[IngestJob], user_id: int | None = None) -> int:
    """Revoke the leave of every uploader of `jobs` (of `user_id` only, if given) that may no
    longer upload there; returns how many were revoked."""
    jobs = jobs.select_related("channel__experiment__collection")
    if not jobs.exists():  # the common case, and every test without the ingest pipeline
        return 0
    ingest, revoked = services().ingest, 0
    for job in jobs:
        for uploader in ingest.leaves(job.id) or {}:
            if not uploader.isdigit() or (user_id is not None and uploader != str(user_id)):
                continue  # the service's own (tests, benchmarks), or not the user that changed
            if not may_upload(int(uploader), job):
                ingest.revoke(job.id, uploader)
                revoked += 1
    return revoked


def may_upload(user_id: int, job: IngestJob) -> bool:
    """Whether the user may upload the job's tiles now, read from the database (not the cache)."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or not user.is_active:
        return False
    chan = job.channel
    level = auth.access_level(user, chan.experiment.collection, chan.experiment, chan, fresh=True)
    return level >= auth.WRITE and (job.creator_id == user.pk or level >= auth.ADMIN)


def _job_deleted(sender: Any, instance: IngestJob, **_: Any) -> None:
    if instance.state != "uploading":
        return
    ingest = services().ingest
    try:
        job = ingest.job(instance.id)
    except NotFound:
        return  # never recorded in the tile index, or removed already
    ingest.stop(job, delete_tiles=True)
