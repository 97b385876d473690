"""Neuroglancer's `middleauth+https://` protocol, so a stock Neuroglancer opens a private channel
(`precomputed://middleauth+https://host/precomputed/c/e/ch`, `zarr3://middleauth+https://...`):

- `GET /auth_info` -> `{"login_url": <this server>}`: where Neuroglancer sends its user to log in;
- `GET /api/v1/authorize`: the login page Neuroglancer opens in a popup. The user gives a token;
  the page checks it against this server and hands `{"token", "app_urls"}` to the page that
  opened it with `postMessage`, addressed to one origin at a time among those allowed (this
  server's own, where its Neuroglancer is served, and NDSTORE_NEUROGLANCER_ORIGINS): a browser
  delivers a message only to an opener of the origin it names, so the token reaches no other.
  Neuroglancer then sends it as `Authorization: Bearer`, asks for a login again on a 401, and
  stops on a 403 (no permission).

The page never puts the token in a URL, loads nothing from elsewhere (its Content-Security-Policy
allows only its own script and requests to this server) and may not be framed.
"""

from __future__ import annotations

import base64
import hashlib
import os

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

from ndstore.api.browser_http import with_cors

LOGIN_PATH = "/api/v1/authorize"
SCRIPT = """
const form = document.getElementById("login"), said = document.getElementById("said");
const origins = JSON.parse(document.getElementById("origins").textContent);
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = form.token.value.trim();
  if (!window.opener) { said.textContent = "Open this page from Neuroglancer."; return; }
  const answer = await fetch("/v1/collection/", {headers: {Authorization: "Bearer " + token}});
  if (answer.status !== 200) { said.textContent = "This token is not valid here."; return; }
  const message = {token: token, app_urls: [window.location.origin]};
  for (const origin of origins) window.opener.postMessage(message, origin);
  said.textContent = "Signed in: you may close this window.";
  window.close();
});
""".strip()
SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()


def own_origin(request: HttpRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


def allowed_origins(request: HttpRequest) -> list[str]:
    """Where the login page may hand a token: this server's own origin and the configured
    Neuroglancer origins (NDSTORE_NEUROGLANCER_ORIGINS, comma-separated, e.g.
    `https://neuroglancer-demo.appspot.com`)."""
    own = own_origin(request)
    configured = [o.strip().rstrip("/") for o in os.environ.get("NDSTORE_NEUROGLANCER_ORIGINS", "").split(",")]
    return [own, *[o for o in configured if o and o != own]]


@require_safe
def auth_info(request: HttpRequest) -> HttpResponse:
    """Where to log in: this server (Neuroglancer opens `{login_url}/api/v1/authorize`)."""
    return with_cors(JsonResponse({"login_url": own_origin(request)}))


@require_safe
def authorize(request: HttpRequest) -> HttpResponse:
    response = render(request, "ndstore/authorize.html", {"script": SCRIPT, "origins": allowed_origins(request)})
    response["Content-Security-Policy"] = (f"default-src 'none'; script-src '{SCRIPT_HASH}'; connect-src 'self'; "
                                           "style-src 'unsafe-inline'; form-action 'none'; frame-ancestors 'none'")
    response["X-Frame-Options"] = "DENY"
    # a popup that keeps its opener: under the default `same-origin` a Neuroglancer served from
    # another origin loses `window.opener` and can be handed nothing
    response["Cross-Origin-Opener-Policy"] = "unsafe-none"
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    return response


# ndstore.api.urls includes them at the root.
urlpatterns = [
    path("auth_info", auth_info),
    path(LOGIN_PATH.lstrip("/"), authorize),
]
