"""Annotations in the viewer, end to end: 100,000 synapses (lines, with `presyn` and `postsyn`
relationships to the public label channel `syn/e1/ann`) are written through the API, then stock
Neuroglancer, served by the live server and run in headless Chromium, opens the layer from
/precomputed-annotations/ beside the label channel:

- unfiltered, in the 3-D panel: it reads the layer's spatial index and draws the synapses (many
  pixels of the annotations' default yellow, where the page draws nothing else);
- with one segment selected in the label layer and the annotation layer filtered by it
  (`linkedSegmentationLayer`, `filterBySegmentation`): it asks the relationship indexes for that
  segment, which list exactly the synapses written with it, and draws only those (far fewer
  yellow pixels than all 100,000; Neuroglancer's annotation list tab lists no annotations of a
  precomputed source, so the drawing and the files read are what there is to check);
- a synapse written after that shows in a fresh load of the layer: in the relationship index of
  its segment, and in the coarsest spatial cell (its id is chosen so that its priority puts it
  there), which Neuroglancer reads whenever it shows the layer.

Skipped only where Chromium or the Neuroglancer build is missing (as tests/viewer/
test_neuroglancer_e2e.py).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import requests
from PIL import Image
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, Response
from rest_framework.test import APIClient

from ndstore.api.models import Collection
from ndstore.core.annotations.spatial import priority
from tests.annotation_decoder import multiple
from tests.api.conftest import make_dataset
from tests.viewer.test_neuroglancer_e2e import browser, pytestmark, wait_for  # noqa: F401  (fixture; skip marks)

FRAME = (2000, 2000, 200)  # 8 x 8 x 8 um at 4 x 4 x 40 nm
NM = (4.0, 4.0, 40.0)
N = 100_000
PER_REQUEST = 10_000
SEGMENTS = 500  # pre- and postsynaptic segment ids are 1..SEGMENTS
CHOSEN = 17  # the segment the viewer selects
LEGEND_PX = 120
MIN_DRAWN = 5000  # yellow pixels of 100,000 lines in the 3-D panel: far more


@pytest.fixture
def synapses(admin: APIClient) -> dict[str, Any]:
    """The public collection `syn`: label channel `ann`, annotation layer `synapses` of N lines."""
    make_dataset(admin, "syn", frame=FRAME, levels=1, channels={"ann": "uint64"},
                 frame_fields=dict(zip(("x_voxel_size", "y_voxel_size", "z_voxel_size"), NM)))
    Collection.objects.filter(name="syn").update(public=True)
    layer = {"annotation_type": "line", "segmentation": "ann", "relationships": ["presyn", "postsyn"],
             "properties": [{"id": "score", "type": "float32"}]}
    assert admin.post("/v1/annotations/syn/e1/synapses/", layer, format="json").status_code == 201
    rng = np.random.default_rng(4)
    at = rng.uniform([0, 0, 0], [FRAME[0] - 30, FRAME[1] - 30, FRAME[2] - 3], (N, 3)).round(1)
    pre, post = rng.integers(1, SEGMENTS + 1, N), rng.integers(1, SEGMENTS + 1, N)
    started = time.monotonic()
    for start in range(0, N, PER_REQUEST):
        rows = [f"{i + 1},{x},{y},{z},{x + 25},{y + 25},{z + 2},{(i % 97) / 97},{p},{q}"
                for i, (x, y, z), p, q in zip(range(start, start + PER_REQUEST), at[start:start + PER_REQUEST],
                                              pre[start:start + PER_REQUEST], post[start:start + PER_REQUEST])]
        body = "id,ax,ay,az,bx,by,bz,score,presyn,postsyn\n" + "\n".join(rows)
        r = admin.generic("POST", "/v1/annotations/syn/e1/synapses/annotations/", body.encode(),
                          content_type="text/csv")
        assert r.status_code == 200, r.content
    print(f"\n{N} synapses written in {time.monotonic() - started:.1f} s")
    return {"presyn": {i + 1 for i in np.flatnonzero(pre == CHOSEN)},
            "postsyn": {i + 1 for i in np.flatnonzero(post == CHOSEN)}}


def state(base: str, selected: list[int]) -> str:
    """The label layer (``selected`` segments) and the annotation layer, linked to it and filtered
    by it when a segment is selected; only the 3-D panel, showing the whole frame, nothing drawn
    in it but annotations."""
    annotations: dict[str, Any] = {
        "type": "annotation", "name": "synapses",
        "source": f"precomputed://{base}/precomputed-annotations/syn/e1/synapses",
        "linkedSegmentationLayer": {"presyn": "ann", "postsyn": "ann"}}
    if selected:
        annotations["filterBySegmentation"] = ["presyn", "postsyn"]
    s = {"dimensions": {axis: [nm * 1e-9, "m"] for axis, nm in zip("xyz", NM)},
         "position": [FRAME[0] / 2, FRAME[1] / 2, FRAME[2] / 2], "projectionScale": 4000,
         "layers": [{"type": "segmentation", "source": f"precomputed://{base}/precomputed/syn/e1/ann", "name": "ann",
                     "segments": [str(s) for s in selected]}, annotations],
         "layout": "3d", "showSlices": False, "showAxisLines": False, "showDefaultAnnotations": False,
         "selectedLayer": {"layer": "synapses", "visible": True}}
    return quote(json.dumps(s, separators=(",", ":")), safe=":/,")


class Watch:
    """The answers a page gets from the annotation files, and its errors: uncaught ones, console
    errors, and every exception the page's script throws, caught or not (Neuroglancer catches a
    layer's failure to restore and only shows its message in the status bar), with its stack."""

    def __init__(self, page: Page, prefix: str) -> None:
        self.page, self.prefix = page, prefix
        self.answers, self.errors, self.console, self.thrown, self.heard = [], [], [], [], []  # type: ignore[var-annotated]
        page.context.on("response", self._seen)
        page.on("pageerror", self._uncaught)
        page.on("console", self._console)
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.on("Debugger.paused", self._thrown)
        self.cdp.send("Debugger.enable")
        self.cdp.send("Debugger.setPauseOnExceptions", {"state": "all"})

    def _seen(self, response: Response) -> None:
        self.heard.append(f"{response.status} {response.url}")
        if response.url.startswith(self.prefix):
            self.answers.append(response)

    def _uncaught(self, error: Error) -> None:
        self.errors.append(error.stack or str(error))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console.append(f"{message.text} {message.location}")

    def _thrown(self, event: dict[str, Any]) -> None:
        data = event.get("data") or {}
        if len(self.thrown) < 20:
            self.thrown.append(f"{data.get('description', data)} (after {self.heard[-8:]})")
        try:
            self.cdp.send("Debugger.resume")
        except Error:  # the page closed meanwhile
            pass

    def files(self, part: str) -> list[Response]:
        return [r for r in self.answers if part in r.url and r.status in (200, 304)]

    def ids(self, part: str, info: dict[str, Any]) -> set[int]:
        """The annotation ids of the files answered under ``part`` (200s; their bodies decoded)."""
        return {a.id for r in self.files(part) if r.status == 200 for a in multiple(r.body(), info)}  # type: ignore

    def report(self) -> str:
        """What the page shows and threw, for a failure's message."""
        shown = self.page.evaluate("""() => ({
            layers: [...document.querySelectorAll('.neuroglancer-layer-item-label')].map(e => e.textContent),
            status: [...document.querySelectorAll('button')].filter(b => b.textContent === 'Dismiss')
                        .map(b => b.parentElement.textContent)})""")
        return f"page: {shown}; errors: {self.errors}; console: {self.console[-10:]}; thrown: {self.thrown}"

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        try:
            wait_for(condition, self.page, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; {self.report()}") from None


LAYERS_JS = "() => [...document.querySelectorAll('.neuroglancer-layer-item-label')].map(e => e.textContent)"


def opened(chromium: Browser, url: str, prefix: str) -> tuple[Page, Watch]:
    """A new page on the viewer's URL, once Neuroglancer made its layers: both of them, or the
    failure says why not (it creates them all at once from the URL, and shows only the message
    of one that failed, in its status bar: without it, a wait for that layer's files runs out)."""
    page = chromium.new_page(viewport={"width": 1000, "height": 800})
    watch = Watch(page, prefix)
    page.goto(url)
    watch.wait_for(lambda: bool(page.evaluate(LAYERS_JS)), "Neuroglancer's layers")
    assert page.evaluate(LAYERS_JS) == ["ann", "synapses"], watch.report()
    return page, watch


def yellow(page: Page) -> int:
    png = page.locator(".neuroglancer-rendered-data-panel").first.screenshot()
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))[LEGEND_PX:].reshape(-1, 3).astype(np.int16)
    return int(((rgb[:, 0] > 120) & (rgb[:, 1] > 120) & (rgb[:, 2] < rgb[:, 0] // 2)).sum())


def low_priority_id(threshold: int) -> int:
    """An id past N whose priority is below ``threshold``: written, it goes to the coarsest level."""
    candidates = np.arange(N + 1, N + 1_000_001, dtype=np.uint64)
    return int(candidates[np.argmax(priority(candidates) < np.uint64(threshold))])


def test_neuroglancer_shows_100k_synapses_and_one_segments_through_the_relationship_index(
        live_server: Any, synapses: dict[str, set[int]], admin: APIClient, browser: Browser,  # noqa: F811
        tmp_path: Any) -> None:
    base = live_server.url
    prefix = f"{base}/precomputed-annotations/syn/e1/synapses/"
    # over HTTP: once Playwright runs, this thread is an async context Django's ORM refuses
    http = requests.Session()
    http.headers["Authorization"] = admin._credentials["HTTP_AUTHORIZATION"]
    info = http.get(f"{prefix}info").json()
    viewer = f"{base}/neuroglancer/#!"

    page, watch = opened(browser, viewer + state(base, []), prefix)
    watch.wait_for(lambda: bool(watch.files("/spatial")), f"a spatial cell from {prefix}")
    watch.wait_for(lambda: yellow(page) >= MIN_DRAWN, "the synapses drawn in the 3-D panel")
    page.screenshot(path=str(tmp_path / "all.png"))
    everyone = yellow(page)
    shown = watch.ids("/spatial", info)
    assert len(shown) >= 500 and shown <= set(range(1, N + 1)), len(shown)
    assert all(r.status in (200, 304) for r in watch.answers), [(r.status, r.url) for r in watch.answers]
    assert not watch.errors, watch.report()
    page.close()

    page, watch = opened(browser, viewer + state(base, [CHOSEN]), prefix)
    for rel in ("presyn", "postsyn"):
        watch.wait_for(lambda rel=rel: bool(watch.files(f"/rel_{rel}/{CHOSEN}")),  # type: ignore[misc]
                       f"rel_{rel}/{CHOSEN} from {prefix}")
        assert watch.ids(f"/rel_{rel}/{CHOSEN}", info) == synapses[rel]
    watch.wait_for(lambda: yellow(page) > 0, f"segment {CHOSEN}'s synapses drawn")
    page.wait_for_timeout(1000)  # its few hundred synapses all drawn, not the 100,000
    page.screenshot(path=str(tmp_path / "segment.png"))
    assert yellow(page) < everyone / 2, f"more than one segment's synapses drawn: {tmp_path / 'segment.png'}"
    assert not watch.errors, watch.report()
    page.close()

    # a new synapse of the segment, with a priority that puts it in the coarsest cell
    coarse = http.get(f"{prefix}spatial0/0_0_0").content
    threshold = int(priority(np.array([a.id for a in multiple(coarse, info)], np.uint64)).max())
    new = low_priority_id(threshold)
    body = [{"id": str(new), "pointA": [1000, 1000, 100], "pointB": [1040, 1040, 104],
             "relationships": {"presyn": [str(CHOSEN)], "postsyn": ["1"]}}]
    assert http.post(f"{base}/v1/annotations/syn/e1/synapses/annotations/", json=body).status_code == 200
    for selected, part in (([], "/spatial0/0_0_0"), ([CHOSEN], f"/rel_presyn/{CHOSEN}")):
        page, watch = opened(browser, viewer + state(base, selected), prefix)
        watch.wait_for(lambda w=watch, p=part: bool(w.files(p)), f"{part} from {prefix}")  # type: ignore[misc]
        assert new in watch.ids(part, info), f"the new synapse {new} is not in {part}"
        page.close()
