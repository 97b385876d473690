"""A share link in a stock Neuroglancer, end to end: the local stack behind an https front, its
Neuroglancer build, a user who may read a private channel and mints a read-only share link for
it (POST /v1/tokens/ with "share": true). Chromium opens the link: /share/ puts the token where
Neuroglancer's middleauth+ looks for a login, clears it from the address bar and opens the
channel, whose chunks load with the token and are drawn. No request carries the token but in its
Authorization header (not in a URL, a Referer or the server's access log). Once the token is
revoked, or once it expires, the channel is refused (401) and nothing more is read."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
from playwright.sync_api import BrowserContext, Page, sync_playwright

from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.viewer.test_middleauth_neuroglancer import (
    ADMIN_TOKEN,
    CHROMIUM,
    CHROMIUM_ARGS,
    call,
    gray_levels,
    self_signed_certificate,
    wait_for,
)
from tests.viewer.test_middleauth_neuroglancer import pytestmark as needs  # Chromium, Neuroglancer, openssl

pytestmark = [*needs, pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

SHAPE_ZYX = (16, 256, 256)
CHANNEL = "share/e1/img8"


@contextlib.contextmanager
def logged_to(path: Path) -> Iterator[None]:
    """The processes started inside write their stderr, the service's request log among it, to
    `path` (they inherit file descriptor 2 as it is while they start)."""
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def request_log(stack: LocalStack) -> str:
    return (stack.data_dir / "stderr.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    data = tmp_path_factory.mktemp("share-stack")
    local = LocalStack(data, port=free_port(), workers=1, threads=4, with_merger=False, with_runner=False,
                       extra_env=own_stack_env({
                           "NDSTORE_ADMIN_TOKEN": ADMIN_TOKEN, "NDSTORE_FRONT_TLS_CERTIFICATE": str(cert),
                           "NDSTORE_FRONT_TLS_KEY": str(key)}))
    with logged_to(data / "stderr.log"):
        local.start()
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def sharer(stack: LocalStack) -> str:
    """The token of a user who may read the private channel CHANNEL, which holds ramps."""
    for path, body in [("/v1/coord/share_frame/", {"x_stop": 256, "y_stop": 256, "z_stop": 16}),
                       ("/v1/collection/share/", {}),
                       ("/v1/collection/share/experiment/e1/", {"coord_frame": "share_frame"}),
                       ("/v1/collection/share/experiment/e1/channel/img8/", {"datatype": "uint8"}),
                       ("/v1/collection/share/experiment/e1/channel/img16/", {"datatype": "uint16"})]:
        r = call(stack, "POST", path, json=body)
        assert r.status_code == 201, (path, r.text)
    z, y, x = np.indices(SHAPE_ZYX)
    r = call(stack, "POST", f"/v1/cutout/{CHANNEL}/0/0:256/0:256/0:16/",
             data=((x + 2 * y + 8 * z) % 256).astype(np.uint8).tobytes(),
             headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    minted = subprocess.run([sys.executable, "-m", "ndstore.cli", "token", "--user", "sharer",
                             "--data-dir", str(stack.data_dir)],
                            env=stack.environment(), capture_output=True, text=True, check=True)
    r = call(stack, "POST", "/v1/permissions/", json={"user": "sharer", "collection": "share", "level": "write"})
    assert r.status_code == 201, r.text
    return minted.stdout.strip().split()[-1]


def share_link(stack: LocalStack, sharer: str, expires_in: int) -> dict[str, Any]:
    r = call(stack, "POST", "/v1/tokens/", headers={"Authorization": f"Token {sharer}"},
             json={"label": "for a colleague", "scope": CHANNEL, "level": "read", "expires_in": expires_in,
                   "share": True})
    assert r.status_code == 201, r.text
    link = r.json()
    assert link["share_url"] == f"{stack.url}/share/#token={link['key']}&view={CHANNEL}&layer=image"
    return link


class Seen:
    """Every request a browser context makes, and the answers of the channel's files."""

    def __init__(self, context: BrowserContext):
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.channel: list[tuple[int, str, str | None]] = []
        context.on("request", lambda r: self.requests.append((r.url, r.headers)))
        context.on("response", lambda r: self.channel.append((r.status, r.url, r.request.headers.get("authorization")))
                   if f"/precomputed/{CHANNEL}/" in r.url else None)

    def chunks(self, status: int) -> list[str]:
        return [url for code, url, _ in self.channel if code == status and "/0/" in url]


def reopened(context: BrowserContext, browser: Any) -> tuple[Page, Seen]:
    """The viewer opened again with what the first one kept (localStorage) and a fresh HTTP cache."""
    again = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600},
                                storage_state=context.storage_state())
    seen = Seen(again)
    return again.new_page(), seen


def open_link(page: Page, seen: Seen, url: str) -> None:
    page.goto(url)
    wait_for(lambda: bool(seen.chunks(200)), page, "a chunk read with the shared token")


def test_a_share_link_opens_the_channel_read_only_until_it_is_revoked(stack: LocalStack, sharer: str) -> None:
    link = share_link(stack, sharer, 600)
    key = link["key"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600})
        seen = Seen(context)
        page = context.new_page()
        open_link(page, seen, link["share_url"])
        assert all(auth == f"Bearer {key}" for status, _, auth in seen.channel if status == 200)
        wait_for(lambda: gray_levels(page.screenshot()) > 40, page, "the channel drawn")
        shown = urlsplit(page.url)
        assert shown.path == "/neuroglancer/" and key not in page.url  # the fragment cleared, then replaced
        assert f"middleauth+{stack.url}/precomputed/{CHANNEL}" in requests.utils.unquote(shown.fragment)
        for url, headers in seen.requests:  # the token only ever in an Authorization header
            assert key not in url and key not in headers.get("referer", ""), url
            assert urlsplit(url).netloc == urlsplit(stack.url).netloc, url  # and to nothing but this server
        # read-only: the same token writes nothing, here or beside
        refused = requests.post(f"{stack.url}/v1/cutout/{CHANNEL}/0/0:8/0:8/0:1/", data=bytes(64), verify=False,
                                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/octet-stream"},
                                timeout=30)
        assert refused.status_code == 403, refused.text

        r = call(stack, "DELETE", f"/v1/tokens/{link['id']}/", headers={"Authorization": f"Token {sharer}"})
        assert r.status_code == 204, r.text
        page, seen = reopened(context, browser)
        page.goto(shown.geturl())
        wait_for(lambda: any(code == 401 for code, _, _ in seen.channel), page, "the channel refused")
        page.wait_for_timeout(1000)
        assert {code for code, _, _ in seen.channel} == {401}, seen.channel  # the info refused: no chunk asked for
        browser.close()
    log = request_log(stack)
    assert "GET /share/ " in log and "GET /neuroglancer/ " in log  # the server saw the pages, not the fragment
    assert key not in log


def test_a_share_link_stops_reading_when_it_expires(stack: LocalStack, sharer: str) -> None:
    link = share_link(stack, sharer, 20)  # time to load Neuroglancer and read a chunk first, on a busy host
    expires = time.monotonic() + 20
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 800, "height": 600})
        seen = Seen(context)
        page = context.new_page()
        open_link(page, seen, link["share_url"])
        viewer_url = page.url
        time.sleep(max(0.0, expires - time.monotonic()) + 0.5)
        page, seen = reopened(context, browser)
        page.goto(viewer_url)
        wait_for(lambda: any(code == 401 for code, _, _ in seen.channel), page, "the channel refused")
        page.wait_for_timeout(1000)
        assert {code for code, _, _ in seen.channel} == {401}, seen.channel
        browser.close()
    answer = requests.get(f"{stack.url}/precomputed/{CHANNEL}/info", headers={"Authorization": f"Bearer {link['key']}"},
                          verify=False, timeout=30)
    assert answer.status_code == 401 and answer.json()["message"] == "token expired"
