"""Neuroglancer's middleauth+ login against this server, in headless Chromium: the page
Neuroglancer opens as a popup (`{login_url}/api/v1/authorize`, login_url from `/auth_info`) checks
the token the user gives and hands `{token, app_urls}` to its opener with postMessage, as
Neuroglancer's middleauth credentials provider waits for it, and only to an opener of an allowed
origin: this server's own, or one named in NDSTORE_NEUROGLANCER_ORIGINS.

The opener is the Neuroglancer this server hosts. `localhost` and `127.0.0.1` name two origins of
the same live server, so an opener on one and the login page on the other is a page of another
origin asking for the token."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from playwright.sync_api import Browser, Page
from rest_framework.test import APIClient

from tests.viewer.test_neuroglancer_e2e import browser, pytestmark  # noqa: F401  (fixture; skip marks)


def token_of(admin: APIClient) -> str:
    return str(admin._credentials["HTTP_AUTHORIZATION"].split()[1])


def login(chromium: Browser, opener_origin: str, server: str, token: str) -> tuple[list[Any], str]:
    """What an opener at ``opener_origin`` receives once the user signs in with ``token`` on the
    login page of ``server`` (found through /auth_info, as Neuroglancer finds it), and what the
    page then says."""
    page: Page = chromium.new_page()
    info = json.loads(chromium.new_page().goto(f"{server}/auth_info").text())  # as Neuroglancer finds it
    page.goto(f"{opener_origin}/neuroglancer/")  # the viewer this server hosts, as the opener
    page.evaluate("window.received = []; window.addEventListener('message', e => window.received.push(e.data))")
    login_url = info["login_url"]
    with page.expect_popup() as popped:
        page.evaluate(f"window.open({json.dumps(login_url + '/api/v1/authorize')}, 'login', 'width=400,height=650')")
    popup = popped.value
    popup.wait_for_load_state()
    popup.fill("#token", token)
    popup.click("button[type=submit]")
    deadline = time.monotonic() + 10
    said = ""
    while time.monotonic() < deadline:
        try:
            said = popup.inner_text("#said", timeout=1000)
        except Exception:  # noqa: BLE001 - the page closed itself once it had sent the token
            said = "closed"
        if said:
            break
        page.wait_for_timeout(100)
    page.wait_for_timeout(300)
    return page.evaluate("window.received"), said


def test_a_token_reaches_the_opener_on_this_servers_origin(admin: APIClient, live_server: Any,
                                                           browser: Browser) -> None:  # noqa: F811
    server = live_server.url
    received, _ = login(browser, server, server, token_of(admin))
    assert received == [{"token": token_of(admin), "app_urls": [server]}]


def test_a_wrong_token_is_refused_on_the_page_and_nothing_is_sent(admin: APIClient, live_server: Any,
                                                                  browser: Browser) -> None:  # noqa: F811
    received, said = login(browser, live_server.url, live_server.url, "not-a-token")
    assert received == [] and "not valid" in said


def test_an_opener_of_another_origin_gets_no_token(admin: APIClient, live_server: Any, browser: Browser,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = live_server.url.replace("localhost", "127.0.0.1")
    assert elsewhere != live_server.url
    received, said = login(browser, elsewhere, live_server.url, token_of(admin))
    assert received == [] and said in ("closed", "Signed in: you may close this window.")
    monkeypatch.setenv("NDSTORE_NEUROGLANCER_ORIGINS", elsewhere)  # an operator allows that viewer
    received, _ = login(browser, elsewhere, live_server.url, token_of(admin))
    assert received == [{"token": token_of(admin), "app_urls": [live_server.url]}]
