"""The Django admin for resources, tokens and grants.

Resources cannot be deleted here: the API's DELETE also drops a channel's cached, buffered and
stored data, which a bare row delete would leave behind with no owner."""

from typing import Any

from django.contrib import admin

from ndstore.api.models import ApiToken, AuditEntry, Channel, Collection, CoordinateFrame, Experiment, Grant


class ResourceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    search_fields = ("name", "description")

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(CoordinateFrame)
class CoordinateFrameAdmin(ResourceAdmin):
    list_display = ("name", "x_stop", "y_stop", "z_stop", "x_voxel_size", "y_voxel_size", "z_voxel_size",
                    "voxel_unit")


@admin.register(Collection)
class CollectionAdmin(ResourceAdmin):
    list_display = ("name", "public", "description")
    list_filter = ("public",)


@admin.register(Experiment)
class ExperimentAdmin(ResourceAdmin):
    list_display = ("name", "collection", "coord_frame", "num_hierarchy_levels", "hierarchy_method",
                    "num_time_samples")
    list_filter = ("collection", "hierarchy_method")


@admin.register(Channel)
class ChannelAdmin(ResourceAdmin):
    list_display = ("name", "experiment", "type", "datatype", "downsample_status", "cache_write_through")
    list_filter = ("type", "datatype", "downsample_status")


@admin.register(Grant)
class GrantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "level", "collection", "experiment", "channel")
    list_filter = ("level",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "label", "created", "level", "expires")
    readonly_fields = ("key_hash", "parent")


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: the log records what happened, nobody edits it."""

    list_display = ("at", "username", "method", "path", "status", "remote_addr")
    list_filter = ("method", "status")
    search_fields = ("username", "path")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False
