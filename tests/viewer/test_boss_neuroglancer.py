"""A public channel in a stock Neuroglancer through its `boss://` source, end to end: the local
stack behind an https front (a test certificate), the Neuroglancer build it serves, a layer
`boss://https://127.0.0.1:<port>/<collection>/<experiment>/<channel>`.

What the source does (google/neuroglancer src/datasource/boss/, the version deploy/neuroglancer
pins): it reads /latest/collection/{c}/experiment/{e}/, each of the experiment's channels,
/latest/coord/{frame}/ and /latest/downsample/{c}/{e}/{ch} (no trailing slash), then cutouts of
512 x 512 x 16 boxes, `Accept: image/jpeg` for uint8, `application/npygz` otherwise (both
checked here: a uint8 and a uint16 channel). Each request goes first without
credentials; only a 401, 403, 500 or 504 makes it ask its Keycloak (`https://auth<host less its
first label>/auth`) for a token, in a popup. So a public channel is drawn with no login at all,
and the source needs https only because it builds that auth URL from the data URL when the layer
opens: `boss://http://...` fails at once ("Unable to construct auth server hostname")."""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np
import pytest
import requests
from PIL import Image
from playwright.sync_api import Page, Request, Response, sync_playwright

from ndstore.ops.localstack import LocalStack
from tests.viewer.test_middleauth_neuroglancer import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TIMEOUT_S,
    call,
    https_stack,  # noqa: F401  (the fixture)
    wait_for,
)
from tests.viewer.test_middleauth_neuroglancer import pytestmark as viewer_marks

pytestmark = [*viewer_marks, pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

SHAPE_ZYX = (16, 256, 256)
CENTRE = (128, 128, 8)  # x, y, z of the voxel drawn at the panel's centre
# A plain grayscale shader: the pixel's gray is the voxel's value (the default one rescales it).
SHADER = "void main() { emitGrayscale(toNormalized(getDataValue())); }"


def ramps() -> np.ndarray:
    """uint8 (z, y, x): x + 2y + 8z (mod 256), so each voxel of a drawn patch is known by where it is."""
    z, y, x = np.indices(SHAPE_ZYX)
    return ((x + 2 * y + 8 * z) % 256).astype(np.uint8)


CHANNELS = {"img8": ("uint8", "image/jpeg"), "img16": ("uint16", "application/npygz")}  # what the source asks


@pytest.fixture(scope="module")
def public_experiment(https_stack: LocalStack) -> str:  # noqa: F811
    """bosspub/e1 in a public collection, 4 x 4 x 40 nm voxels: img8, uint8 `ramps()`, and img16,
    uint16 `ramps()` x 257 (its normalized values are img8's)."""
    depth, height, width = SHAPE_ZYX
    for path, body in [("/v1/coord/boss_frame/", {"x_stop": width, "y_stop": height, "z_stop": depth,
                                                  "x_voxel_size": 4, "y_voxel_size": 4, "z_voxel_size": 40,
                                                  "voxel_unit": "nanometers"}),
                       ("/v1/collection/bosspub/", {}),
                       ("/v1/collection/bosspub/experiment/e1/",
                        {"coord_frame": "boss_frame", "num_hierarchy_levels": 1}),
                       *[(f"/v1/collection/bosspub/experiment/e1/channel/{name}/", {"type": "image", "datatype": dtype})
                         for name, (dtype, _) in CHANNELS.items()]]:
        r = call(https_stack, "POST", path, json=body)
        assert r.status_code == 201, (path, r.text)
    for name, voxels in (("img8", ramps()), ("img16", ramps().astype(np.uint16) * 257)):
        r = call(https_stack, "POST", f"/v1/cutout/bosspub/e1/{name}/0/0:{width}/0:{height}/0:{depth}/",
                 data=voxels.tobytes(), headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, r.text
    r = call(https_stack, "PUT", "/v1/collection/bosspub/", json={"public": True})
    assert r.status_code == 200, r.text
    return "bosspub/e1"


def viewer_url(stack: LocalStack, source: str, panel: bool = False) -> str:
    """The served Neuroglancer on one xy panel, 1 voxel : 1 pixel, centred on voxel CENTRE; with
    `panel`, the layer's side panel open (its data source's messages)."""
    state = {"dimensions": {"x": [4e-9, "m"], "y": [4e-9, "m"], "z": [4e-8, "m"]},
             "position": [c + 0.5 for c in CENTRE], "crossSectionScale": 1, "layout": "xy",
             "showAxisLines": False, "showScaleBar": False,
             "layers": [{"type": "image", "source": source, "name": "img8", "shader": SHADER}]}
    if panel:
        state["selectedLayer"] = {"layer": "img8", "visible": True}
    return f"{stack.url}/neuroglancer/#!{quote(json.dumps(state))}"


def panel_centre(page: Page, half: int = 32) -> dict[str, float]:
    box = page.locator(".neuroglancer-rendered-data-panel").first.bounding_box()
    assert box is not None, "Neuroglancer drew no data panel"
    cx, cy = round(box["x"] + box["width"] / 2), round(box["y"] + box["height"] / 2)
    return {"x": cx - half, "y": cy - half, "width": 2 * half, "height": 2 * half}


def ramp_error(png: bytes) -> float:
    """How far the clip's grays are from the ramps around CENTRE (the median circular distance,
    at the best shift of a pixel either way: where the panel's centre falls in a voxel)."""
    gray = np.asarray(Image.open(io.BytesIO(png)).convert("L")).astype(np.int16)
    rows, cols = np.indices(gray.shape)
    x0, y0, z0 = CENTRE
    best = 256.0
    for dy in range(-1, 2):
        for dx in range(-1, 2):
            x = x0 - gray.shape[1] // 2 + cols + dx
            y = y0 - gray.shape[0] // 2 + rows + dy
            expected = (x + 2 * y + 8 * z0) % 256
            diff = np.abs(gray - expected)
            best = min(best, float(np.median(np.minimum(diff, 256 - diff))))
    return best


@pytest.mark.parametrize("name", list(CHANNELS))
def test_neuroglancer_boss_source_draws_a_public_channel_over_https(https_stack: LocalStack,  # noqa: F811
                                                                    public_experiment: str, name: str) -> None:
    channel = f"{public_experiment}/{name}"
    media = CHANNELS[name][1]
    host = urlsplit(https_stack.url).netloc
    sent: list[Request] = []
    answered: list[Response] = []
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600})
            context.on("request", lambda r: sent.append(r))
            context.on("response", lambda r: answered.append(r))
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(viewer_url(https_stack, f"boss://{https_stack.url}/{channel}", panel=True))

            def cutouts() -> list[Response]:
                return [r for r in answered if f"/latest/cutout/{channel}/0/" in r.url]

            wait_for(lambda: any(r.status == 200 for r in cutouts()), page, "a cutout read")
            clip = panel_centre(page)
            wait_for(lambda: ramp_error(page.screenshot(clip=clip)) <= 1, page, "the ramps drawn")

            latest = [r for r in answered if urlsplit(r.url).path.startswith("/latest/")]
            paths = {urlsplit(r.url).path for r in latest}
            assert {"/latest/collection/bosspub/experiment/e1/", "/latest/coord/boss_frame/",
                    *[f"/latest/collection/bosspub/experiment/e1/channel/{other}/" for other in CHANNELS],
                    f"/latest/downsample/{channel}"} <= paths, paths
            assert all(r.status == 200 for r in latest), [(r.status, r.url) for r in latest]
            assert {r.request.headers.get("accept") for r in cutouts()} == {media}
            assert {r.headers.get("content-type") for r in cutouts()} == {media}
            # anonymous all along: no token asked for, no login offered
            assert not [r.url for r in sent if "authorization" in r.headers]
            assert not [r.url for r in sent if urlsplit(r.url).netloc not in (host, "")
                        and not r.url.startswith(("data:", "blob:"))]
            assert page.get_by_text("login", exact=False).count() == 0
            assert page.locator(".neuroglancer-message-error").count() == 0
            assert len(context.pages) == 1  # no Keycloak popup
            assert not errors, errors

        finally:
            browser.close()


def test_over_plain_http_the_boss_source_fails_before_any_request(https_stack: LocalStack,  # noqa: F811
                                                                   public_experiment: str) -> None:
    """It cannot build its auth server's URL from an http one, so the layer fails as it opens."""
    host = urlsplit(https_stack.url).netloc
    sent: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600})
            context.on("request", lambda r: sent.append(r.url))
            page = context.new_page()
            page.goto(viewer_url(https_stack, f"boss://http://{host}/{public_experiment}/img8", panel=True))
            refused = page.locator(".neuroglancer-message-error", has_text="Unable to construct auth server hostname")
            refused.first.wait_for(timeout=TIMEOUT_S * 1000)
            assert not [url for url in sent if "/latest/" in url]
        finally:
            browser.close()


def test_the_channel_reads_anonymously_as_the_boss_source_asks(https_stack: LocalStack,  # noqa: F811
                                                               public_experiment: str) -> None:
    """What the viewer read above, field by field as the source parses it (frontend.ts)."""

    def get(path: str) -> dict[str, Any]:
        r = requests.get(f"{https_stack.url}/latest/{path}", verify=False, timeout=30)
        assert r.status_code == 200, (path, r.text)  # anonymously
        return r.json()  # type: ignore[no-any-return]

    experiment = get("collection/bosspub/experiment/e1/")
    assert sorted(experiment["channels"]) == sorted(CHANNELS) and experiment["coord_frame"] == "boss_frame"
    assert (experiment["name"], experiment["collection"], experiment["num_hierarchy_levels"]) == ("e1", "bosspub", 1)
    channel = get("collection/bosspub/experiment/e1/channel/img8/")
    assert (channel["type"], channel["datatype"], channel["name"]) == ("image", "uint8", "img8")
    assert isinstance(channel["description"], str) and isinstance(channel["downsample_status"], str)
    assert isinstance(channel["base_resolution"], int)
    frame = get("coord/boss_frame/")
    assert frame["voxel_unit"] == "nanometers" and frame["x_voxel_size"] == 4 and frame["x_stop"] == 256
    downsample = get("downsample/bosspub/e1/img8")
    assert downsample["num_hierarchy_levels"] == 1
    assert downsample["voxel_size"]["0"] == [4, 4, 40] and downsample["extent"]["0"] == [256, 256, 16]
    jpeg = requests.get(f"{https_stack.url}/latest/cutout/bosspub/e1/img8/0/0:256/0:256/0:16/",
                        headers={"Accept": "image/jpeg"}, verify=False, timeout=30)
    assert jpeg.status_code == 200 and jpeg.headers["Content-Type"] == "image/jpeg"
    pixels = np.asarray(Image.open(io.BytesIO(jpeg.content))).astype(np.int16)
    assert pixels.shape == (16 * 256, 256)
    diff = np.abs(pixels - ramps().reshape(-1, 256))
    assert float(np.median(np.minimum(diff, 256 - diff))) <= 2
