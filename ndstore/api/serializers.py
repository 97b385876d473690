"""Resource serializers in the Boss v1 JSON shapes (what intern sends and expects)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ndstore.api.models import Channel, Collection, CoordinateFrame, Experiment


class _Base(serializers.ModelSerializer):
    creator = serializers.SerializerMethodField()
    # Fields that fix how stored voxels are laid out: changing them would corrupt the data.
    immutable: tuple[str, ...] = ()

    def get_creator(self, obj: Any) -> str:
        return obj.creator.username if obj.creator else ""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None:
            for field in self.immutable:
                if field in attrs and attrs[field] != getattr(self.instance, field):
                    raise serializers.ValidationError({field: f"{field} cannot be changed after creation"})
        return attrs


class CoordinateFrameSerializer(_Base):
    immutable = ("x_start", "x_stop", "y_start", "y_stop", "z_start", "z_stop")

    class Meta:
        model = CoordinateFrame
        fields = ["name", "description", "x_start", "x_stop", "y_start", "y_stop", "z_start", "z_stop",
                  "x_voxel_size", "y_voxel_size", "z_voxel_size", "voxel_unit", "creator"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        for axis in "xyz":
            start = attrs.get(f"{axis}_start", getattr(self.instance, f"{axis}_start", 0))
            stop = attrs.get(f"{axis}_stop", getattr(self.instance, f"{axis}_stop", None))
            if stop is not None and stop <= start:
                raise serializers.ValidationError({f"{axis}_stop": f"{axis}_stop must be greater than {axis}_start"})
        return attrs


class CollectionSerializer(_Base):
    experiments = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")

    class Meta:
        model = Collection
        fields = ["name", "description", "experiments", "creator", "public"]


class ExperimentSerializer(_Base):
    collection = serializers.SlugRelatedField(read_only=True, slug_field="name")
    coord_frame = serializers.SlugRelatedField(slug_field="name", queryset=CoordinateFrame.objects.all())
    channels = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")
    immutable = ("coord_frame", "hierarchy_method")

    class Meta:
        model = Experiment
        fields = ["name", "description", "collection", "coord_frame", "num_hierarchy_levels", "hierarchy_method",
                  "num_time_samples", "time_step", "time_step_unit", "channels", "creator"]


class ChannelSerializer(_Base):
    experiment = serializers.SlugRelatedField(read_only=True, slug_field="name")
    sources = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    related = serializers.SerializerMethodField()
    storage_type = serializers.SerializerMethodField()  # intern.array reads it: "spdb" is the Boss's own store
    immutable = ("type", "datatype")

    class Meta:
        model = Channel
        fields = ["name", "description", "experiment", "default_time_sample", "type", "base_resolution",
                  "datatype", "creator", "sources", "downsample_status", "related", "cache_write_through",
                  "storage_type"]
        read_only_fields = ["downsample_status"]

    def get_related(self, obj: Channel) -> list[str]:
        return []

    def get_storage_type(self, obj: Channel) -> str:
        return "spdb"

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        kind = attrs.get("type", getattr(self.instance, "type", "image"))
        datatype = attrs.get("datatype", getattr(self.instance, "datatype", "uint8"))
        if datatype not in Channel.TYPES[kind]:
            raise serializers.ValidationError(
                {"datatype": f"{kind} channels store one of {', '.join(Channel.TYPES[kind])}, not {datatype}"}
            )
        experiment = self.context["experiment"]
        if attrs.get("base_resolution", 0) >= experiment.num_hierarchy_levels:
            raise serializers.ValidationError(
                {"base_resolution": "must be below the experiment's num_hierarchy_levels"}
            )
        missing = [s for s in attrs.get("sources", []) if not experiment.channels.filter(name=s).exists()]
        if missing:
            raise serializers.ValidationError({"sources": f"no such channel in this experiment: {', '.join(missing)}"})
        return attrs
