"""The Django admin for resources, tokens and grants."""

from django.contrib import admin

from ndstore.api.models import ApiToken, Channel, Collection, CoordinateFrame, Experiment, Grant

for model in (CoordinateFrame, Collection, Experiment, Channel, Grant):
    admin.site.register(model)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "label", "created")
    readonly_fields = ("key_hash",)
