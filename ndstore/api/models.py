"""Metadata: coordinate frames, the collection -> experiment -> channel hierarchy (Boss v1
field names), API tokens (stored hashed) and per-resource permission grants."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}"
NAME_RULE = "names are 1-64 letters, digits, '_' or '-', not starting with '-'"
name_validator = RegexValidator(rf"\A{NAME_PATTERN}\Z", NAME_RULE)  # \Z: `$` would let a trailing newline in
MAX_COORD = 1 << 30


def _name_field() -> models.CharField:
    return models.CharField(max_length=64, validators=[name_validator])


class Resource(models.Model):
    description = models.CharField(max_length=4096, blank=True, default="")
    creator = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        abstract = True


class CoordinateFrame(Resource):
    UNITS = ["nanometers", "micrometers", "millimeters", "centimeters"]
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    x_start = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    x_stop = models.BigIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_COORD)])
    y_start = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    y_stop = models.BigIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_COORD)])
    z_start = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    z_stop = models.BigIntegerField(validators=[MinValueValidator(1), MaxValueValidator(MAX_COORD)])
    x_voxel_size = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    y_voxel_size = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    z_voxel_size = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    voxel_unit = models.CharField(max_length=16, default="nanometers", choices=[(u, u) for u in UNITS])


class Collection(Resource):
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    public = models.BooleanField(default=False)


class Experiment(Resource):
    METHODS = ["anisotropic", "isotropic"]
    collection = models.ForeignKey(Collection, on_delete=models.PROTECT, related_name="experiments")
    name = _name_field()
    coord_frame = models.ForeignKey(CoordinateFrame, on_delete=models.PROTECT, related_name="experiments")
    num_hierarchy_levels = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(20)]
    )
    hierarchy_method = models.CharField(max_length=16, default="anisotropic", choices=[(m, m) for m in METHODS])
    num_time_samples = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1 << 20)]
    )
    time_step = models.FloatField(null=True, blank=True)
    time_step_unit = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["collection", "name"], name="unique_experiment_name")]


class Channel(Resource):
    TYPES = {"image": ["uint8", "uint16", "uint32", "uint64", "float32"], "annotation": ["uint32", "uint64"]}
    DATATYPES = ["uint8", "uint16", "uint32", "uint64", "float32"]
    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="channels")
    name = _name_field()
    type = models.CharField(max_length=16, default="image", choices=[(t, t) for t in TYPES])
    datatype = models.CharField(max_length=16, default="uint8", choices=[(d, d) for d in DATATYPES])
    base_resolution = models.PositiveIntegerField(default=0)
    default_time_sample = models.PositiveIntegerField(default=0)
    sources = models.JSONField(default=list, blank=True)
    downsample_status = models.CharField(max_length=32, default="NOT_DOWNSAMPLED")
    # Bit r: a client wrote to level r (ndstore.api.levels); the base, bit 0, always counts.
    written_levels = models.PositiveBigIntegerField(default=1)
    # Cache-tier writes of this channel reach the base tier before they are acknowledged.
    cache_write_through = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experiment", "name"], name="unique_channel_name")]

    def save(self, *args: Any, **kwargs: Any) -> None:
        # written_levels only gains bits, by an UPDATE that ORs them in (ndstore.api.levels): a
        # whole-row save of a channel loaded before another worker's write must not undo one.
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [f.name for f in self._meta.concrete_fields
                                       if not f.primary_key and f.name != "written_levels"]
        super().save(*args, **kwargs)


def hash_token(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """An API token. Only its SHA-256 is stored; the key itself is shown once, when minted.

    A scoped token (`level` set) acts with at most that level, never as staff or superuser, and
    only inside its resource (the narrowest of collection/experiment/channel given; none: all the
    user's). Deleting the resource deletes the token (a token whose scope went null would widen).
    A token minted by a scoped token (`parent`) goes with it. See ndstore/api/scopes.py."""

    SCOPED_LEVELS = ["read", "write"]
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    label = models.CharField(max_length=128, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    level = models.CharField(max_length=8, blank=True, default="", choices=[(k, k) for k in SCOPED_LEVELS])
    collection = models.ForeignKey(Collection, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    experiment = models.ForeignKey(Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    expires = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="+")

    @classmethod
    def mint(cls, user: object, label: str = "", key: str | None = None, **scope: Any) -> tuple[ApiToken, str]:
        key = key or secrets.token_hex(20)
        return cls.objects.create(user=user, key_hash=hash_token(key), label=label, **scope), key


class Grant(models.Model):
    """A permission level on a collection, or on one experiment or channel inside it.
    One row per (user, resource); views keep it so with update_or_create."""

    LEVELS = {"read": 1, "write": 2, "admin": 3}
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="grants")
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="grants")
    experiment = models.ForeignKey(Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="grants")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="grants")
    level = models.CharField(max_length=8, choices=[(k, k) for k in LEVELS])


class IngestJob(models.Model):
    """A tile ingest into one channel's box at resolution 0. Its progress lives in the tile index
    and the job's queues (ndstore.engine.ingest); this row says what was asked and where it stands."""

    STATES = ["uploading", "complete", "cancelled"]
    FORMATS = ["png", "tif"]
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="ingest_jobs")
    creator = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    x_start = models.PositiveIntegerField()
    x_stop = models.PositiveIntegerField()
    y_start = models.PositiveIntegerField()
    y_stop = models.PositiveIntegerField()
    z_start = models.PositiveIntegerField()
    z_stop = models.PositiveIntegerField()
    t_start = models.PositiveIntegerField(default=0)
    t_stop = models.PositiveIntegerField(default=1)
    tile_size_x = models.PositiveIntegerField()
    tile_size_y = models.PositiveIntegerField()
    file_format = models.CharField(max_length=8, default="png", choices=[(f, f) for f in FORMATS])
    state = models.CharField(max_length=16, default="uploading", choices=[(s, s) for s in STATES])
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)


class DownsampleJob(models.Model):
    """A build of a channel's resolution hierarchy through SQS (ndstore.engine.downsample);
    its progress lives with the run's queue and state rows."""

    STATES = ["IN_PROGRESS", "DOWNSAMPLED", "FAILED", "CANCELLED"]
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="downsample_jobs")
    creator = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    state = models.CharField(max_length=16, default="IN_PROGRESS", choices=[(s, s) for s in STATES])
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)


class IdCounter(models.Model):
    """The next annotation id that `/v1/reserve/` hands out in one channel (Boss reserve_ids).
    Advanced by one conditional UPDATE, so concurrent reservations never overlap."""

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, related_name="id_counter")
    next_id = models.BigIntegerField(default=1)


class MetaValue(models.Model):
    """One metadata key-value pair on a collection, experiment or channel (Boss `/v1/meta/`)."""

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="+")
    experiment = models.ForeignKey(Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=128)
    value = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["collection", "key"], condition=models.Q(experiment__isnull=True),
                                    name="unique_meta_key_collection"),
            models.UniqueConstraint(fields=["experiment", "key"],
                                    condition=models.Q(experiment__isnull=False, channel__isnull=True),
                                    name="unique_meta_key_experiment"),
            models.UniqueConstraint(fields=["channel", "key"], condition=models.Q(channel__isnull=False),
                                    name="unique_meta_key_channel"),
        ]


class AuditEntry(models.Model):
    """One state-changing request to the control plane (resources, grants, jobs, merges): who,
    what, its target as the view parsed it, from where, and how it ended (ndstore.api.audit)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    username = models.CharField(max_length=150, blank=True)  # "" for an anonymous request
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=1024)
    status = models.PositiveSmallIntegerField(null=True)  # null: recorded before the change, outcome not known
    remote_addr = models.CharField(max_length=64, blank=True)
    body = models.JSONField(null=True, blank=True)  # the JSON request body as parsed, when small
    target = models.JSONField(null=True, blank=True)  # what the change applies to; null for a refusal

    class Meta:
        ordering = ["-at", "-id"]


LABEL_DIGITS = 20  # 2^64 - 1 has 20 decimal digits


def label_key(label: int) -> str:
    """A label as SegmentProperty.label stores it: zero-padded decimal, so that uint64 labels fit
    any database (no signed 64-bit column holds 2^63) and order as numbers."""
    return f"{label:0{LABEL_DIGITS}d}"


class SegmentProperty(models.Model):
    """What users wrote about one label of an annotation channel: a name, a description and tags
    (ndstore.api.views.segments). Voxel counts and bounding boxes come from the label index."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="segment_properties")
    label = models.CharField(max_length=LABEL_DIGITS)  # label_key(label)
    name = models.CharField(max_length=256, blank=True, default="")
    description = models.CharField(max_length=4096, blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "label"], name="unique_segment_label")]


class AnnotationLayer(models.Model):
    """A collection of Neuroglancer precomputed annotations of one experiment: one geometry type,
    typed properties, relationships to the segments of one label channel of the experiment
    (ndstore.api.views.annotations). `version` grows with every write: the served indexes are
    rebuilt for a new version (ndstore.api.annotation_index)."""

    TYPES = ["point", "line", "axis_aligned_bounding_box", "ellipsoid"]
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="annotation_layers")
    name = _name_field()
    description = models.CharField(max_length=4096, blank=True, default="")
    annotation_type = models.CharField(max_length=32, choices=[(t, t) for t in TYPES])
    # [{"id", "type", "description"?, "enum_values"?, "enum_labels"?}], in Neuroglancer's info form
    properties = models.JSONField(default=list, blank=True)
    relationships = models.JSONField(default=list, blank=True)  # relationship ids, in order
    segmentation = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="annotation_layers")
    version = models.PositiveBigIntegerField(default=0)
    creator = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experiment", "name"], name="unique_annotation_layer_name")]


def signed_id(value: int) -> int:
    """A uint64 id as the signed 64-bit column holds it (two's complement): any database's
    BIGINT holds every uint64 so, and equality lookups stay exact."""
    return value - (1 << 64) if value >= 1 << 63 else value


def unsigned_id(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


class Annotation(models.Model):
    """One annotation. `aid` is its uint64 id (signed_id); a/b are its two points (a point's b is
    its a; an ellipsoid's b its radii); lo/hi its bounding box; `record` the geometry and property
    values exactly as Neuroglancer's single-annotation encoding has them, relationships aside."""

    layer = models.ForeignKey(AnnotationLayer, on_delete=models.CASCADE, related_name="annotations")
    aid = models.BigIntegerField()
    ax = models.FloatField()
    ay = models.FloatField()
    az = models.FloatField()
    bx = models.FloatField()
    by = models.FloatField()
    bz = models.FloatField()
    lo_x = models.FloatField()
    lo_y = models.FloatField()
    lo_z = models.FloatField()
    hi_x = models.FloatField()
    hi_y = models.FloatField()
    hi_z = models.FloatField()
    record = models.BinaryField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["layer", "aid"], name="unique_annotation_id")]


class AnnotationSegment(models.Model):
    """One related segment of an annotation: relationship (its index in the layer's list), the
    segment id and the annotation id, both as signed_id. Looked up by segment (the relationship
    index) and by annotation (by_id, rewrites)."""

    layer = models.ForeignKey(AnnotationLayer, on_delete=models.CASCADE, related_name="+")
    relationship = models.PositiveSmallIntegerField()
    segment = models.BigIntegerField()
    aid = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["layer", "relationship", "segment"], name="annotation_segment_lookup"),
                   models.Index(fields=["layer", "aid"], name="annotation_segment_of")]
