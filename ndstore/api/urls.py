"""Routes of the service. Path converters parse names and ranges once, here at the edge."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from ndstore.api import converters  # noqa: F401  (registers the `name` and `range` converters)
from ndstore.api.views import (
    annotation_files,
    annotation_layers,
    audit,
    blaze,
    boss,
    cutout,
    downsample,
    image,
    ingest,
    meshes,
    operations,
    permissions,
    precomputed,
    resources,
    segmentation,
    segments,
    sharded,
    skeletons,
    tokens,
    unrouted,
    zarr,
)

CUTOUT = "<name:collection>/<name:experiment>/<name:channel>/<int:resolution>/<range:x>/<range:y>/<range:z>/"


CHANNEL = "<name:collection>/<name:experiment>/<name:channel>/"
IMAGE_ROUTES = {
    "xy": ("<int:resolution>/<range:x>/<range:y>/<int:z>/", image.XYImage),
    "xz": ("<int:resolution>/<range:x>/<int:y>/<range:z>/", image.XZImage),
    "yz": ("<int:resolution>/<int:x>/<range:y>/<range:z>/", image.YZImage),
}


def image_routes() -> list:  # type: ignore[type-arg]
    routes = []
    for orientation, (tail, view) in IMAGE_ROUTES.items():
        routes.append(path(f"v1/image/{CHANNEL}{orientation}/{tail}", view.as_view()))
        routes.append(path(f"v1/image/{CHANNEL}{orientation}/{tail}<int:t>/", view.as_view()))
    return routes


# The cutout routes of each tier.
CUTOUT_VIEWS: dict[str, type[cutout.CutoutView]] = {
    "v1/cutout/": cutout.CutoutView, "v1/direct/cutout/": cutout.DirectCutoutView,
    "v1/blaze/cutout/": cutout.BlazeCutoutView,
}


def cutout_routes(prefix: str, view: type[cutout.CutoutView]) -> list:  # type: ignore[type-arg]
    return [path(f"{prefix}{CUTOUT}", view.as_view()), path(f"{prefix}{CUTOUT}<range:t>/", view.as_view())]


def standard_view_routes() -> list:  # type: ignore[type-arg]
    """The files of the standard views (precomputed, sharded precomputed, zarr) of a channel."""
    return [path(f"{prefix}/{CHANNEL}{tail}", view.as_view())
            for prefix, routes in (("precomputed", skeletons.ROUTES), ("precomputed-sharded", skeletons.SHARDED_ROUTES),
                                   ("precomputed", meshes.ROUTES), ("precomputed-sharded", meshes.SHARDED_ROUTES),
                                   ("precomputed", segments.ROUTES), ("precomputed-sharded", segments.ROUTES),
                                   ("precomputed", precomputed.ROUTES), ("precomputed-sharded", sharded.ROUTES),
                                   ("zarr", zarr.ROUTES))
            for tail, view in routes]


def data_routes() -> list:  # type: ignore[type-arg]
    """The well-formed cutout, slice-image and standard-view routes: ndstore/api/data_routes.py
    serves their GETs (and the cutouts' POSTs) without the framework's dispatch."""
    return [*[route for prefix, view in CUTOUT_VIEWS.items() for route in cutout_routes(prefix, view)],
            *image_routes(), *standard_view_routes()]


handler500 = "ndstore.api.errors.server_error"  # JSON, like every other error

urlpatterns = [
    path("v1/collection/", resources.CollectionList.as_view()),
    path("v1/collection/<name:name>/", resources.CollectionView.as_view()),
    path("v1/collection/<name:collection>/experiment/", resources.ExperimentList.as_view()),
    path("v1/collection/<name:collection>/experiment/<name:name>/", resources.ExperimentView.as_view()),
    path("v1/collection/<name:collection>/experiment/<name:experiment>/channel/", resources.ChannelList.as_view()),
    path(
        "v1/collection/<name:collection>/experiment/<name:experiment>/channel/<name:name>/",
        resources.ChannelView.as_view(),
    ),
    path("v1/coord/", resources.CoordFrameList.as_view()),
    path("v1/coord/<name:name>/", resources.CoordFrameView.as_view()),
    path("v1/permissions/", permissions.PermissionsView.as_view()),
    path("v1/audit/", audit.AuditLogView.as_view()),
    path("v1/tokens/", tokens.TokenList.as_view()),
    path("v1/tokens/<int:token_id>/", tokens.TokenView.as_view()),
    path("metrics", operations.MetricsView.as_view()),
    path("metrics/", operations.MetricsView.as_view()),
    *boss.routes(),  # Boss v1 compatibility (intern); before the cutout routes
    *data_routes(),
    *[path(f"{prefix}<path:rest>", cutout.MalformedCutout.as_view()) for prefix in CUTOUT_VIEWS],
    path("v1/image/<path:rest>", image.MalformedImage.as_view()),
    path("v1/blaze/merge/", blaze.BlazeMergeView.as_view()),
    # with and without the trailing slash: Neuroglancer's boss:// source asks for it without
    path("v1/downsample/<name:collection>/<name:experiment>/<name:channel>/", downsample.DownsampleView.as_view()),
    path("v1/downsample/<name:collection>/<name:experiment>/<name:channel>", downsample.DownsampleView.as_view()),
    path("v1/segmentation/<name:collection>/<name:experiment>/<name:channel>/",
         segmentation.SegmentationView.as_view()),
    *[path(f"v1/segments/{CHANNEL}{tail}", view.as_view()) for tail, view in segments.API_ROUTES],
    *[path(f"v1/annotations/<name:collection>/<name:experiment>/{tail}", view.as_view())
      for tail, view in annotation_layers.ROUTES],
    *[path(f"precomputed-annotations/<name:collection>/<name:experiment>/<name:layer>/{tail}", view.as_view())
      for tail, view in annotation_files.ROUTES],
    path("v1/ingest/", ingest.IngestJobList.as_view()),
    path("v1/ingest/<int:job_id>/", ingest.IngestJobView.as_view()),
    path("v1/ingest/<int:job_id>/complete/", ingest.IngestJobComplete.as_view()),
    path("v1/ingest/<int:job_id>/retry/", ingest.IngestJobRetry.as_view()),
    path("v1/ingest/<int:job_id>/tasks/", ingest.IngestTasks.as_view()),
    path("v1/ingest/<int:job_id>/tasks/failed/", ingest.IngestFailedTasks.as_view()),
    path("v1/ingest/<int:job_id>/uploads/", ingest.IngestUploads.as_view()),
    path("v1/ingest/tiles/<path:key>", ingest.LocalTileUpload.as_view()),
    path("v1/blaze/merge/<slug:request_id>/", blaze.BlazeMergeRequestView.as_view()),
    # (?s): a path with a line break in it is answered too (Django's path converters stop at one)
    re_path(r"^precomputed/(?P<rest>(?s:.+))\Z", precomputed.NoSuchFile.as_view()),
    re_path(r"^precomputed-sharded/(?P<rest>(?s:.+))\Z", sharded.NoSuchFile.as_view()),
    re_path(r"^zarr/(?P<rest>(?s:.+))\Z", zarr.NoSuchFile.as_view()),
    re_path(r"^precomputed-annotations/(?P<rest>(?s:.+))\Z", annotation_files.NoSuchFile.as_view()),
    path("admin/", admin.site.urls),
    path("", include("ndstore.api.views.middleauth")),  # Neuroglancer's middleauth+: /auth_info, the login page
    path("", include("ndstore.api.views.landing")),  # `/` and `/neuroglancer/`
    path("", include("ndstore.api.views.share")),  # `/share/`: what a share link opens
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    re_path(r"^v1/", unrouted.Unrouted.as_view()),  # last: a JSON 400/404 for what nothing above matched
]
