"""End to end, as a visitor: headless Chromium (Debian's, driven by Playwright) opens the landing
page of a live server on 127.0.0.1, follows a public channel's "View in Neuroglancer" link to the
Neuroglancer build this server hosts, and the viewer loads the channel's chunks from
/precomputed/ (by the other links, from /precomputed-sharded/ and from /zarr/ as `zarr3://`) and
draws them (WebGL through SwiftShader: no GPU needed). Every request the page and its workers
make stays on the live server: the viewer works with no internet access.

Skipped only where Chromium or the Neuroglancer build is missing: `make test` installs both
(apt package `chromium`; deploy/neuroglancer/install.sh).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import Browser, Page, sync_playwright
from rest_framework.test import APIClient

from ndstore.api.models import Collection
from ndstore.api.views.landing import neuroglancer_installed
from tests.api.conftest import make_dataset

CHROMIUM = os.environ.get("NDSTORE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# SwiftShader gives headless Chromium WebGL 2 on the CPU; the rest keeps Chromium off the network.
CHROMIUM_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
SHAPE_ZYX = (16, 256, 256)  # one frame; Neuroglancer draws it 1 voxel : 1 pixel by default
CHANNEL = "pub/e1/img8"
PYRAMID_ZYX = (16, 1024, 1024)  # three levels; drawn zoomed out, 4 voxels : 1 pixel, Neuroglancer reads level 2
PYRAMID = "pyr/e1/img8"
ZOOMED_OUT = 4.0
TIMEOUT_S = 90

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: apt-get install chromium "
                                                "(`make test` installs it)"),
    pytest.mark.skipif(not neuroglancer_installed(), reason="the Neuroglancer build is not installed: run "
                                                            "deploy/neuroglancer/install.sh (`make test` runs it)"),
]


def pattern() -> np.ndarray:
    """A uint8 (z, y, x) volume of diagonal ramps: one gray level per voxel column step, so a
    drawn patch holds many distinct gray levels where blank panels hold one or two."""
    z, y, x = np.indices(SHAPE_ZYX)
    return ((x + 2 * y + 8 * z) % 256).astype(np.uint8)


@pytest.fixture
def public_channel(admin: APIClient) -> str:
    """A public one-level uint8 channel holding `pattern()`, written through the cache tier."""
    depth, height, width = SHAPE_ZYX
    ds = make_dataset(admin, "pub", frame=(width, height, depth), levels=1, channels={"img8": "uint8"})
    Collection.objects.filter(name="pub").update(public=True)
    url = ds.cutout("img8", 0, (0, width), (0, height), (0, depth))
    r = admin.generic("POST", url, pattern().tobytes(), content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    return CHANNEL


@pytest.fixture
def public_pyramid(admin: APIClient) -> str:
    """A public three-level uint8 channel: level 0 is 32-voxel blocks of random gray (1..255),
    levels 1 and 2 built from it as a downsample job builds them (ndstore.api.demo)."""
    from ndstore.api import lookups
    from ndstore.api.demo import build_every_level

    depth, height, width = PYRAMID_ZYX
    ds = make_dataset(admin, "pyr", frame=(width, height, depth), levels=3, channels={"img8": "uint8"})
    Collection.objects.filter(name="pyr").update(public=True)
    blocks = np.random.default_rng(7).integers(1, 256, (1, height // 32, width // 32), np.uint8)
    data = np.repeat(np.repeat(np.repeat(blocks, depth, 0), 32, 1), 32, 2)
    r = admin.generic("POST", ds.cutout("img8", 0, (0, width), (0, height), (0, depth)), data.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    _, _, chan = lookups.channel_path("pyr", "e1", "img8")
    build_every_level(chan, lookups.channel_volume(chan))
    return PYRAMID


@pytest.fixture
def browser(live_server: Any) -> Iterator[Browser]:
    """Chromium, closed before the test database goes: the live server's threads serving its
    kept-alive connections finish first (one that outlived the test would touch a dropped table)."""
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any("process_request_thread" in t.name for t in threading.enumerate()):
        time.sleep(0.02)


def wait_for(condition: Callable[[], bool], page: Page, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            shot = Path(os.environ.get("TMPDIR", "/tmp")) / f"neuroglancer-timeout-{os.getpid()}.png"
            page.screenshot(path=str(shot))
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (the page: {shot})")
        page.wait_for_timeout(200)  # lets Playwright deliver the browser's events meanwhile


def gray_levels(png: bytes) -> int:
    """How many distinct gray levels (r == g == b) an image holds: the crosshair, the bounding box
    and the panel outlines are coloured, so only drawn voxels add many."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(np.int16)
    gray = rgb[(rgb[:, 0] == rgb[:, 1]) & (rgb[:, 1] == rgb[:, 2]), 0]
    return len(np.unique(gray))


def xy_panel_centre(page: Page) -> dict[str, float]:
    """A 64 x 64 pixel clip at the centre of the first (xy) panel, inside the drawn volume."""
    box = page.locator(".neuroglancer-rendered-data-panel").first.bounding_box()
    assert box is not None, "Neuroglancer drew no data panel"
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    return {"x": cx - 32, "y": cy - 32, "width": 64, "height": 64}


VIEWS = {  # the landing page's link class -> the view's URL prefix, its metadata file, how a chunk URL looks
    "neuroglancer": ("precomputed", "info", lambda url: not url.endswith("/info")),
    "neuroglancer-sharded": ("precomputed-sharded", "info", lambda url: url.endswith(".shard")),
    "neuroglancer-zarr": ("zarr", "zarr.json", lambda url: "/c/" in url),
}


def zoomed_out(href: str, scale: float) -> str:
    """The landing link with the viewer zoomed out: `scale` finest voxels per screen pixel. The
    scale is in units of the state's dimensions, so they are set (the frame's voxels are 1 nm)
    where the link leaves them to the data source."""
    viewer, fragment = href.split("#!", 1)
    state = json.loads(unquote(fragment))
    state.setdefault("dimensions", {axis: [1e-9, "m"] for axis in "xyz"})
    state["crossSectionScale"] = scale
    return f"{viewer}#!{quote(json.dumps(state, separators=(',', ':')), safe=':/,')}"


@pytest.mark.parametrize("link_class", list(VIEWS))
def test_landing_link_opens_neuroglancer_on_the_channel(live_server: Any, public_channel: str, browser: Browser,
                                                        tmp_path: Path, link_class: str) -> None:
    show(live_server, browser, tmp_path, link_class, public_channel)


@pytest.mark.parametrize("link_class", list(VIEWS))
def test_zoomed_out_neuroglancer_reads_a_built_level(live_server: Any, public_pyramid: str, browser: Browser,
                                                     tmp_path: Path, link_class: str) -> None:
    """Zoomed out 4:1, the viewer asks each view for level 2 (built by the hierarchy, advertised
    because it holds data) and draws it: the centre is not black."""
    levels = show(live_server, browser, tmp_path, link_class, public_pyramid, ZOOMED_OUT, min_gray_levels=16)
    assert "2" in levels, f"the zoomed-out viewer read levels {levels}, not level 2"


def show(live_server: Any, browser: Browser, tmp_path: Path, link_class: str, channel: str,
         scale: float | None = None, min_gray_levels: int = 32) -> set[str]:
    """Open the channel's landing link (zoomed out to `scale` when given), wait for its chunks and
    a drawn xy panel; return the levels the chunks read came from."""
    view, metadata, is_chunk = VIEWS[link_class]
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    requests: list[str] = []
    responses: list[tuple[int, str]] = []
    errors: list[str] = []
    page.context.on("request", lambda r: requests.append(r.url))
    page.context.on("response", lambda r: responses.append((r.status, r.url)))
    page.on("pageerror", lambda e: errors.append(str(e)))

    page.goto(f"{live_server.url}/")
    page.screenshot(path=str(tmp_path / "landing.png"), full_page=True)
    link = page.locator(f'a.{link_class}[data-channel="{channel}"]')
    href = link.get_attribute("href")
    assert href is not None and href.startswith(f"{live_server.url}/neuroglancer/#!"), href
    if scale is None:
        link.click()
    else:
        page.goto(zoomed_out(href, scale))
    page.wait_for_url(f"{live_server.url}/neuroglancer/**")
    page.locator("canvas").first.wait_for(state="visible", timeout=TIMEOUT_S * 1000)

    prefix = f"{live_server.url}/{view}/{channel}/"
    chunks = lambda: [s for s, u in responses if u.startswith(prefix) and is_chunk(u)]
    served = (200, 206)  # a sharded reader asks for byte ranges of shard files
    wait_for(lambda: any(status in served for status in chunks()), page,
             f"a chunk from {prefix} (responses: {responses})")
    assert (200, f"{prefix}{metadata}") in responses
    clip = xy_panel_centre(page)
    wait_for(lambda: gray_levels(page.screenshot(clip=clip)) >= min_gray_levels, page,
             "the xy panel to show the voxels")

    shot = tmp_path / "neuroglancer.png"
    page.locator("canvas").first.screenshot(path=str(shot))
    assert gray_levels(shot.read_bytes()) >= min_gray_levels, f"the canvas looks blank: {shot}"
    assert all(status in served for status in chunks()), responses
    assert not errors, errors
    offsite = [u for u in requests if not u.startswith((live_server.url, "data:", "blob:"))]
    assert not offsite, f"the viewer reached beyond this server: {offsite}"
    # every view's chunk URL starts with its level: {scale key}/..., {level}/c/...
    return {u[len(prefix):].split("/")[0] for _, u in responses if u.startswith(prefix) and is_chunk(u)}
