"""Advance the metadata generation (meta_cache.py) on every change to what it caches; register a
new annotation channel in the label index (label_channels.py)."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from ndstore.api import label_channels, meta_cache
from ndstore.api.models import ApiToken, Channel, Collection, CoordinateFrame, Experiment, Grant
from ndstore.core.errors import StorageError
from ndstore.wiring import metadata_generation

log = logging.getLogger(__name__)


def _bump() -> None:
    try:
        metadata_generation().bump()
    except StorageError as exc:  # cached lookups then expire by age (meta_cache.MAX_AGE_S)
        log.warning("metadata changed but the generation could not advance: %s", exc)


def metadata_changed(**_: Any) -> None:
    _bump()
    meta_cache.forget_request_generation()
    transaction.on_commit(_bump)


def connect() -> None:
    for model in (Collection, Experiment, Channel, CoordinateFrame, Grant, ApiToken, get_user_model()):
        post_save.connect(metadata_changed, sender=model, dispatch_uid=f"ndmeta-save-{model.__name__}")
        post_delete.connect(metadata_changed, sender=model, dispatch_uid=f"ndmeta-delete-{model.__name__}")
    post_save.connect(label_channels.registered_when_created, sender=Channel, dispatch_uid="ndlabels-channel")
