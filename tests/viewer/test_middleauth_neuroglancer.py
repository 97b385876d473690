"""A private channel in a stock Neuroglancer, end to end: the local stack behind an https front
(a test certificate; Neuroglancer speaks middleauth+ over https only), the Neuroglancer build it
serves, a layer `precomputed://middleauth+https://.../precomputed/c/e/ch`. Neuroglancer finds the
login through /auth_info, the user signs in on the popup with their token, and the channel's
chunks load with `Authorization: Bearer` and are drawn; once the user's grant is revoked, the
channel is refused (403) and nothing more is read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import requests
import urllib3
from playwright.sync_api import Page, sync_playwright

from ndstore.api.views.landing import neuroglancer_installed
from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env

CHROMIUM = os.environ.get("NDSTORE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
                 "--ignore-certificate-errors"]
ADMIN_TOKEN = "middleauth-e2e-admin-token-0123456789"
SHAPE_ZYX = (16, 256, 256)
TIMEOUT_S = 90

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (`make test` installs it)"),
    pytest.mark.skipif(not neuroglancer_installed(), reason="the Neuroglancer build is not installed "
                                                            "(`make test` runs deploy/neuroglancer/install.sh)"),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate"),
]


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files in ``directory``); the
    warnings of clients told not to verify it are silenced."""
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def https_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    stack = LocalStack(tmp_path_factory.mktemp("https-stack"), port=free_port(), workers=1, threads=4,
                       with_merger=False, extra_env=own_stack_env({
                           "NDSTORE_ADMIN_TOKEN": ADMIN_TOKEN, "NDSTORE_FRONT_TLS_CERTIFICATE": str(cert),
                           "NDSTORE_FRONT_TLS_KEY": str(key)}))
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def call(stack: LocalStack, method: str, path: str, headers: dict[str, str] | None = None,
         **kw: Any) -> requests.Response:
    return requests.request(method, f"{stack.url}{path}", headers={"Authorization": f"Token {ADMIN_TOKEN}",
                                                                    **(headers or {})},
                            verify=False, timeout=60, **kw)


def private_channel(stack: LocalStack) -> tuple[np.ndarray, str]:
    """A private uint8 channel of ramps, and the token of a user who may read it."""
    for path, body in [("/v1/coord/mauth_frame/", {"x_stop": 256, "y_stop": 256, "z_stop": 16}),
                       ("/v1/collection/mauth/", {}),
                       ("/v1/collection/mauth/experiment/e1/",
                        {"coord_frame": "mauth_frame", "num_hierarchy_levels": 1}),
                       ("/v1/collection/mauth/experiment/e1/channel/img8/", {"type": "image", "datatype": "uint8"})]:
        r = call(stack, "POST", path, json=body)
        assert r.status_code == 201, (path, r.text)
    z, y, x = np.indices(SHAPE_ZYX)
    voxels = ((x + 2 * y + 8 * z) % 256).astype(np.uint8)
    r = call(stack, "POST", "/v1/cutout/mauth/e1/img8/0/0:256/0:256/0:16/", data=voxels.tobytes(),
             headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    minted = subprocess.run([sys.executable, "-m", "ndstore.cli", "token", "--user", "viewer",
                             "--data-dir", str(stack.data_dir)],
                            env=stack.environment(), capture_output=True, text=True, check=True)
    token = minted.stdout.strip().split()[-1]
    r = call(stack, "POST", "/v1/permissions/", json={"user": "viewer", "collection": "mauth", "level": "read"})
    assert r.status_code == 201, r.text
    return voxels, token


def gray_levels(png: bytes) -> int:
    import io

    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(np.int16)
    gray = rgb[(rgb[:, 0] == rgb[:, 1]) & (rgb[:, 1] == rgb[:, 2])]
    return len(np.unique(gray[:, 0]))


def wait_for(condition: Any, page: Page, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        page.wait_for_timeout(200)


def test_neuroglancer_opens_a_private_channel_through_middleauth(https_stack: LocalStack) -> None:
    _, token = private_channel(https_stack)
    source = f"precomputed://middleauth+{https_stack.url}/precomputed/mauth/e1/img8"
    state = {"layers": [{"type": "image", "source": source, "name": "img8"}], "layout": "xy",
             "position": [128, 128, 8]}
    chunks: list[tuple[int, str | None]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600})
        context.on("response", lambda r: chunks.append((r.status, r.request.headers.get("authorization")))
                   if "/precomputed/mauth/e1/img8/0/" in r.url else None)
        page = context.new_page()
        page.goto(f"{https_stack.url}/neuroglancer/#!{quote(json.dumps(state))}")
        button = page.get_by_role("button", name="Request login.")
        button.wait_for(timeout=TIMEOUT_S * 1000)
        with page.expect_popup() as popped:
            button.click()
        popup = popped.value
        popup.wait_for_load_state()
        popup.fill("#token", token)
        popup.click("button[type=submit]")
        wait_for(lambda: any(status == 200 for status, _ in chunks), page, "a chunk read with the token")
        assert all(auth == f"Bearer {token}" for status, auth in chunks if status == 200)
        wait_for(lambda: gray_levels(page.screenshot()) > 40, page, "the channel drawn")
        # the grant revoked: the viewer opened again with the token it kept (localStorage; a fresh
        # HTTP cache, since a browser may keep a file max-age=30 s) is refused at once, reads nothing
        r = call(https_stack, "DELETE", "/v1/permissions/?collection=mauth&user=viewer")
        assert r.status_code == 204, r.text
        again = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600},
                                    storage_state=context.storage_state())
        refused: list[int] = []
        again.on("response", lambda r: refused.append(r.status) if "/precomputed/mauth/e1/img8" in r.url else None)
        page = again.new_page()
        page.goto(f"{https_stack.url}/neuroglancer/#!{quote(json.dumps(state))}")
        wait_for(lambda: 403 in refused, page, "the channel refused")
        page.wait_for_timeout(1000)
        assert set(refused) == {403}, refused  # the info refused, so no chunk is asked for
        browser.close()
