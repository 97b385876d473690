"""The landing page at `/`: the public datasets (collection -> experiment -> channel), each channel
with its datatype, extent and levels, the URLs of its views (`/precomputed/`, `/precomputed-sharded/`, `/zarr/`) and a
"View in Neuroglancer" link per view whose state reads the channel from this server.

It also serves Neuroglancer itself at `/neuroglancer/`: the static build that
deploy/neuroglancer/install.sh puts in `<repo>/.neuroglancer/` (or NDSTORE_NEUROGLANCER_DIR), so
the links work with no internet access. Where no build is installed, the links open the public
Neuroglancer demo instead, and the page says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.contrib.auth.models import AnonymousUser
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe
from django.views.generic import RedirectView
from django.views.static import serve

from ndstore.api import auth
from ndstore.api.models import Channel
from ndstore.core.precomputed import NANOMETERS_PER

PUBLIC_NEUROGLANCER = "https://neuroglancer-demo.appspot.com/"
INSTALLER = "deploy/neuroglancer/install.sh"
# Vite names every file under assets/ by its content hash: those may be cached for good.
IMMUTABLE_PREFIX = "assets/"


def neuroglancer_dir() -> Path:
    """Where the static Neuroglancer build lives (read per request, so tests can move it)."""
    configured = os.environ.get("NDSTORE_NEUROGLANCER_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / ".neuroglancer"


def neuroglancer_installed() -> bool:
    return (neuroglancer_dir() / "index.html").is_file()


def neuroglancer_link(viewer: str, source: str, channel: Channel, scheme: str = "precomputed") -> str:
    """A Neuroglancer URL whose state (JSON in the fragment) shows one channel as one layer."""
    layer = {
        "type": "segmentation" if channel.type == "annotation" else "image",
        "source": f"{scheme}://{source}",
        "name": channel.name,
    }
    state: dict[str, Any] = {"layers": [layer]}
    if scheme == "zarr3":  # its axes are t, z, y, x: Neuroglancer would display the first three
        frame = channel.experiment.coord_frame
        metres = NANOMETERS_PER[frame.voxel_unit] * 1e-9
        state["dimensions"] = {"x": [frame.x_voxel_size * metres, "m"], "y": [frame.y_voxel_size * metres, "m"],
                               "z": [frame.z_voxel_size * metres, "m"], "t": [1, ""]}
        state["displayDimensions"] = ["x", "y", "z"]
    state_json = json.dumps(state, separators=(",", ":"))
    return f"{viewer}#!{quote(state_json, safe=':/,')}"


@dataclass(frozen=True)
class ChannelRow:
    channel: Channel
    source: str  # the channel's precomputed URL on this server
    link: str  # the Neuroglancer URL
    zarr_source: str  # its OME-Zarr group URL
    zarr_link: str
    sharded_source: str  # its sharded precomputed URL
    sharded_link: str

    @property
    def path(self) -> str:
        exp = self.channel.experiment
        return f"{exp.collection.name}/{exp.name}/{self.channel.name}"


def public_channels() -> list[Channel]:
    """Every channel an anonymous user may read, in name order. Public read is a collection's
    `public` flag (see ndstore.api.auth.access_level), which the query narrows by first."""
    anonymous = AnonymousUser()
    channels = (Channel.objects.filter(experiment__collection__public=True)
                .select_related("experiment__collection", "experiment__coord_frame")
                .order_by("experiment__collection__name", "experiment__name", "name"))
    return [ch for ch in channels
            if auth.access_level(anonymous, ch.experiment.collection, ch.experiment, ch) >= auth.READ]


def catalogue(request: HttpRequest, viewer: str) -> list[dict[str, Any]]:
    """Public channels grouped as [{collection, experiments: [{experiment, frame, channels}]}]."""
    rows = []
    for ch in public_channels():
        exp = ch.experiment
        names = f"{exp.collection.name}/{exp.name}/{ch.name}"
        source = request.build_absolute_uri(f"/precomputed/{names}")
        zarr = request.build_absolute_uri(f"/zarr/{names}")
        shards = request.build_absolute_uri(f"/precomputed-sharded/{names}")
        rows.append(ChannelRow(ch, source, neuroglancer_link(viewer, source, ch), zarr,
                               neuroglancer_link(viewer, zarr, ch, "zarr3"), shards,
                               neuroglancer_link(viewer, shards, ch)))
    out = []
    for _, in_collection in groupby(rows, key=lambda r: r.channel.experiment.collection_id):
        experiments = []
        for _, in_experiment in groupby(in_collection, key=lambda r: r.channel.experiment_id):
            channels = list(in_experiment)
            exp = channels[0].channel.experiment
            experiments.append({"experiment": exp, "frame": exp.coord_frame, "channels": channels})
        out.append({"collection": experiments[0]["experiment"].collection, "experiments": experiments})
    return out


@require_safe
def landing(request: HttpRequest) -> HttpResponse:
    bundled = neuroglancer_installed()
    viewer = request.build_absolute_uri("/neuroglancer/") if bundled else PUBLIC_NEUROGLANCER
    context = {"collections": catalogue(request, viewer), "bundled": bundled, "viewer": viewer,
               "installer": INSTALLER}
    return render(request, "ndstore/landing.html", context)


@require_safe
def neuroglancer_static(request: HttpRequest, path: str = "") -> HttpResponse:
    """A file of the Neuroglancer build; `/neuroglancer/` is its index.html."""
    if not neuroglancer_installed():
        raise Http404(f"Neuroglancer is not installed on this server: run {INSTALLER}")
    name = path or "index.html"
    response: HttpResponse = serve(request, name, document_root=str(neuroglancer_dir()))
    immutable = name.startswith(IMMUTABLE_PREFIX)
    response["Cache-Control"] = "public, max-age=31536000, immutable" if immutable else "no-cache"
    # its middleauth+ login is a popup (ndstore/api/views/middleauth.py) that must keep its opener
    response["Cross-Origin-Opener-Policy"] = "same-origin-allow-popups"
    return response


# The landing page and the Neuroglancer app; ndstore.api.urls includes them at the root.
urlpatterns = [
    path("", landing, name="landing"),
    path("neuroglancer", RedirectView.as_view(url="/neuroglancer/")),  # the app's URLs are relative
    path("neuroglancer/", neuroglancer_static),
    path("neuroglancer/<path:path>", neuroglancer_static),
]
