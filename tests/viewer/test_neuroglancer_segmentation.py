"""Segmentation products in the viewer, end to end as a visitor: a public uint64 label channel
(4 x 4 x 40 nm voxels) holding three blobs that cross the supercuboid seams is written through
the API, its meshes and skeletons rebuilt by the products pipeline (the runner's poller, as in
tests/api/test_segmentation.py) and its segments named and tagged through `/v1/segments/`. Then
Neuroglancer, served by the live server and run in headless Chromium (WebGL through SwiftShader),
opens the channel from /precomputed/ and from /precomputed-sharded/ with one segment selected:

- the 3-D panel draws the segment's mesh: many pixels of the colour the state gives the segment,
  where the same state with no segment selected draws background only;
- the layer's "Seg." tab lists the names written through the API, and its query box filters the
  list by a tag (`#tag`);
- every request stays on the live server, and none for a mesh, a skeleton or the segment
  properties is answered 4xx/5xx.

Skipped only where Chromium or the Neuroglancer build is missing (as tests/viewer/
test_neuroglancer_e2e.py).
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import Browser, Page
from rest_framework.test import APIClient

from tests.api.test_segmentation import public_label_channel
from tests.viewer.test_neuroglancer_e2e import browser, pytestmark  # noqa: F401  (fixture; skip marks)

FRAME = (600, 96, 14)  # x y z: two uint64 supercuboids (512 x 512 x 8) in x, two in z
NM = (4.0, 4.0, 40.0)
BALL, BIG, TUBE = 7, 2**63 + 5, 2**64 - 1  # labels past 2^63 go through the browser's uint64 too
SEGMENTS: dict[int, dict[str, Any]] = {
    BALL: {"name": "soma-seven", "description": "a ball across the x and z seams", "tags": ["soma", "seam"]},
    BIG: {"name": "bouton-big", "description": "a ball across the x seam", "tags": ["bouton"]},
    TUBE: {"name": "axon-top", "description": "a tube across the x seam", "tags": ["axon", "seam"]},
}
SHOWN = BALL
COLOUR = "#ff0000"  # the shown segment's colour in the state: its pixels are red, shaded
# the rows of Neuroglancer's segment lists (not their column headers, which share the class)
ENTRY_NAMES = ".neuroglancer-segment-list-entry:not(.neuroglancer-segment-list-header):visible " \
              ".neuroglancer-segment-list-entry-name"
LEGEND_PX = 120
MIN_MESH_PIXELS = 5000  # the ball is about 190 pixels across in the panel: ~28,000
TIMEOUT_S = 90
SERVED = (200, 206)  # Neuroglancer asks for byte ranges of fragment data and of shards


def volume() -> np.ndarray:
    """Two balls across the x seam (512), one also across the z seam (8), and a tube of the top
    label across the x seam; none touches the volume's faces."""
    z, y, x = np.ogrid[:FRAME[2], :FRAME[1], :FRAME[0]]
    vol = np.zeros(FRAME[::-1], np.uint64)

    def ball(cx: int, cy: int, cz: float, r_nm: float) -> np.ndarray:
        return ((x - cx) * NM[0]) ** 2 + ((y - cy) * NM[1]) ** 2 + ((z - cz) * NM[2]) ** 2 < r_nm ** 2

    vol[ball(512, 36, 7, 120.0)] = BALL
    vol[ball(500, 76, 4, 60.0)] = BIG
    tube = (((y - 76) * NM[1]) ** 2 + ((z - 10) * NM[2]) ** 2 < 30.0 ** 2) & (x >= 420) & (x < 590)
    vol[np.broadcast_to(tube, vol.shape)] = TUBE
    return vol


@pytest.fixture
def segmented(admin: APIClient) -> np.ndarray:
    """The public label channel `seg/e1/ann`: written, its products rebuilt, its segments named."""
    vol = volume()
    public_label_channel(admin, vol, NM)  # written, every supercuboid's products rebuilt
    body = [{"id": str(label), **props} for label, props in SEGMENTS.items()]
    r = admin.post("/v1/segments/seg/e1/ann/", body, format="json")
    assert r.status_code == 200, r.content
    return vol


def state(url: str, segments: list[int]) -> str:
    """A Neuroglancer URL fragment: the layer from `url` with its "Seg." tab open, only the 3-D
    panel, nothing but meshes and skeletons drawn in it (no cross-sections, axis lines or
    bounding box), `segments` selected, SHOWN in COLOUR, seen whole from above the ball. The
    dimensions are given: Neuroglancer reads `projectionScale` in their units (canonical voxels,
    4 nm here) only then, in metres otherwise."""
    layer = {"type": "segmentation", "source": f"precomputed://{url}", "name": "ann", "tab": "segments",
             "segments": [str(s) for s in segments], "segmentColors": {str(SHOWN): COLOUR}}
    s = {"dimensions": {axis: [nm * 1e-9, "m"] for axis, nm in zip("xyz", NM)}, "position": [512.0, 36.0, 7.0],
         "projectionScale": 256, "layers": [layer], "layout": "3d", "showSlices": False, "showAxisLines": False,
         "showDefaultAnnotations": False, "selectedLayer": {"layer": "ann", "visible": True}}
    return quote(json.dumps(s, separators=(",", ":")), safe=":/,")


def wait_for(condition: Callable[[], bool], page: Page, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            shot = Path(os.environ.get("TMPDIR", "/tmp")) / f"neuroglancer-seg-timeout-{os.getpid()}.png"
            page.screenshot(path=str(shot))
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (the page: {shot})")
        page.wait_for_timeout(200)  # lets Playwright deliver the browser's events meanwhile


def panel_pixels(page: Page) -> np.ndarray:
    """The 3-D panel's pixels below its top LEGEND_PX rows (where the x y z legend and the
    panel's buttons are written), (n, 3) int16 RGB."""
    png = page.locator(".neuroglancer-rendered-data-panel").first.screenshot()
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))[LEGEND_PX:].reshape(-1, 3).astype(np.int16)


def reds(rgb: np.ndarray) -> int:
    """Pixels of COLOUR's family (red, lit or shaded): red well above green and blue."""
    return int(((rgb[:, 0] >= 48) & (rgb[:, 0] > 2 * rgb[:, 1] + 16) & (rgb[:, 0] > 2 * rgb[:, 2] + 16)).sum())


def drawn(rgb: np.ndarray) -> int:
    """Pixels off the black background."""
    return int((rgb.sum(axis=1) > 24).sum())


def listed(page: Page) -> dict[str, set[str]]:
    """The segment lists' shown entries (the query's matches, the selected segments): name -> the
    tags shown after it (`name #tag #tag`). Entries the query filtered out stay in the page, hidden."""
    texts = page.locator(ENTRY_NAMES).all_text_contents()
    return {words[0]: {w[1:] for w in words[1:] if w.startswith("#")} for words in map(str.split, texts) if words}


def names(page: Page) -> set[str]:
    return set(listed(page))


class Watch:
    """What a page and its workers ask for and are answered, and the errors they raise."""

    def __init__(self, page: Page) -> None:
        self.requests: list[str] = []
        self.responses: list[tuple[int, str]] = []
        self.errors: list[str] = []
        page.context.on("request", lambda r: self.requests.append(r.url))
        page.context.on("response", lambda r: self.responses.append((r.status, r.url)))
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def answered(self, prefix: str) -> list[int]:
        return [status for status, url in self.responses if url.startswith(prefix)]

    def products(self, base: str, kind: str) -> list[tuple[int, str]]:
        """The answers to requests for a product's files (`info` excepted) under `base`."""
        return [(s, u) for s, u in self.responses if u.startswith(f"{base}/{kind}/") and not u.endswith("/info")]


@pytest.mark.parametrize("view", ["precomputed", "precomputed-sharded"])
def test_neuroglancer_draws_the_mesh_and_lists_the_properties(live_server: Any, segmented: np.ndarray,
                                                              browser: Browser, tmp_path: Path,  # noqa: F811
                                                              view: str) -> None:
    base = f"{live_server.url}/{view}/seg/e1/ann"
    viewer = f"{live_server.url}/neuroglancer/#!"
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    watch = Watch(page)
    started = time.monotonic()

    # one segment selected: its mesh is drawn, in its colour
    page.goto(viewer + state(base, [SHOWN]))
    wait_for(lambda: any(s in SERVED for s in watch.answered(f"{base}/mesh/")), page,
             f"a mesh from {base}/mesh/ (responses: {watch.responses})")
    wait_for(lambda: reds(panel_pixels(page)) >= MIN_MESH_PIXELS, page, f"segment {SHOWN}'s mesh in the 3-D panel")
    page.screenshot(path=str(tmp_path / "mesh.png"))
    shown = panel_pixels(page)
    assert reds(shown) >= 0.9 * drawn(shown), f"the 3-D panel holds more than the red mesh: {tmp_path / 'mesh.png'}"
    drew_s = time.monotonic() - started
    # its manifest and fragments (unsharded) or shard ranges (sharded), and its skeleton, were read
    for kind in ("mesh", "skeletons"):
        read = watch.products(base, kind)
        assert read and all(s in SERVED for s, _ in read), (kind, read)
        assert view == "precomputed" or all(u.endswith(".shard") for _, u in read), (kind, read)

    # the Seg. tab lists every segment by the name written through the API; a tag query filters it
    everyone = {p["name"] for p in SEGMENTS.values()}
    wait_for(lambda: everyone <= names(page), page, f"the names {everyone} in the segment list ({listed(page)})")
    tags = listed(page)
    assert all(tags[p["name"]] == set(p["tags"]) for p in SEGMENTS.values()), tags
    query = page.locator(".neuroglancer-segment-list-query")
    query.fill("#bouton")
    status = page.locator(".neuroglancer-segment-list-status").first
    wait_for(lambda: "1 match" in (status.text_content() or ""), page,
             f"one match of #bouton ({status.text_content()})")
    # the matches, and the selected segment in the list of visible ones
    assert names(page) == {SEGMENTS[BIG]["name"], SEGMENTS[SHOWN]["name"]}, listed(page)
    page.screenshot(path=str(tmp_path / "filtered.png"))

    # the same state with no segment selected: background only
    control = browser.new_page(viewport={"width": 1200, "height": 800})
    watch_control = Watch(control)
    control.goto(viewer + state(base, []))
    wait_for(lambda: everyone <= names(control), control, "the segment list of the state with none selected")
    control.wait_for_timeout(2000)  # nothing to wait for: a frame or two, drawn with no segment
    control.screenshot(path=str(tmp_path / "none.png"))
    assert reds(panel_pixels(control)) == 0 and drawn(panel_pixels(control)) < MIN_MESH_PIXELS // 10, \
        f"the 3-D panel draws something with no segment selected: {tmp_path / 'none.png'}"
    control.close()

    for w in (watch, watch_control):
        products = [(s, u) for s, u in w.responses
                    if u.startswith(base) and any(p in u for p in ("/mesh/", "/skeletons/", "/segment_properties/"))]
        assert products and all(s < 400 for s, _ in products), products
        assert any("/segment_properties/info" in u for _, u in products), products
        offsite = [u for u in w.requests if not u.startswith((live_server.url, "data:", "blob:"))]
        assert not offsite, f"the viewer reached beyond this server: {offsite}"
        assert not w.errors, w.errors
    print(f"{view}: mesh drawn {drew_s:.1f} s after the page opened; test {time.monotonic() - started:.1f} s")
