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
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
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


@pytest.mark.parametrize("link_class", list(VIEWS))
def test_landing_link_opens_neuroglancer_on_the_channel(live_server: Any, public_channel: str, browser: Browser,
                                                        tmp_path: Path, link_class: str) -> None:
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
    link = page.locator(f'a.{link_class}[data-channel="{public_channel}"]')
    href = link.get_attribute("href")
    assert href is not None and href.startswith(f"{live_server.url}/neuroglancer/#!"), href
    link.click()
    page.wait_for_url(f"{live_server.url}/neuroglancer/**")
    page.locator("canvas").first.wait_for(state="visible", timeout=TIMEOUT_S * 1000)

    prefix = f"{live_server.url}/{view}/{public_channel}/"
    chunks = lambda: [s for s, u in responses if u.startswith(prefix) and is_chunk(u)]  # noqa: E731
    served = (200, 206)  # a sharded reader asks for byte ranges of shard files
    wait_for(lambda: any(status in served for status in chunks()), page,
             f"a chunk from {prefix} (responses: {responses})")
    assert (200, f"{prefix}{metadata}") in responses
    clip = xy_panel_centre(page)
    wait_for(lambda: gray_levels(page.screenshot(clip=clip)) >= 32, page, "the xy panel to show the voxels")

    shot = tmp_path / "neuroglancer.png"
    page.locator("canvas").first.screenshot(path=str(shot))
    assert gray_levels(shot.read_bytes()) >= 32, f"the canvas looks blank: {shot}"
    assert all(status in served for status in chunks()), responses
    assert not errors, errors
    offsite = [u for u in requests if not u.startswith((live_server.url, "data:", "blob:"))]
    assert not offsite, f"the viewer reached beyond this server: {offsite}"
