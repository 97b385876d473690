"""`/share/`: the page a share link opens. A share link (minted by POST /v1/tokens/ with
`"share": true`) is `https://host/share/#token=<key>&view=<c/e/ch>&layer=<image|segmentation>`:
the read-only token rides in the URL's fragment, which a browser sends in no request and writes
in no Referer, so it reaches neither this server's logs nor any other's.

The page's script reads the fragment, clears it from the address bar, stores the token where the
served Neuroglancer's middleauth credentials provider looks for a login of this server
(localStorage `auth_token_v2_<origin>`, the JSON that Neuroglancer itself saves after a login on
/api/v1/authorize) and opens `/neuroglancer/` with one layer
`precomputed://middleauth+<origin>/precomputed/<c/e/ch>`. Everything it names is its own origin:
the token goes to no other. Its Content-Security-Policy allows only its own script and nothing
to load or connect; it may not be framed; it sends no Referer.
"""

from __future__ import annotations

import base64
import hashlib

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

from ndstore.api.models import NAME_PATTERN, Channel
from ndstore.api.views.middleauth import own_origin

SHARE_PATH = "/share/"
STORAGE_KEY = "auth_token_v2_"  # + the login URL: Neuroglancer's middleauth credentials_provider.ts
SCRIPT = r"""
const said = document.getElementById("said");
const given = new URLSearchParams(window.location.hash.slice(1));
history.replaceState(null, "", window.location.pathname);
const token = given.get("token") || "", view = given.get("view") || "", layer = given.get("layer") || "image";
const name = "NAME_PATTERN";
if (!/^[A-Za-z0-9_-]{16,256}$/.test(token) || !new RegExp(`^${name}/${name}/${name}$`).test(view)
    || !["image", "segmentation"].includes(layer)) {
  said.textContent = "This share link is incomplete or malformed: ask for a new one.";
} else {
  const origin = window.location.origin;
  localStorage.setItem("STORAGE_KEY" + origin,
                       JSON.stringify({tokenType: "Bearer", accessToken: token, url: origin, appUrls: [origin]}));
  const source = "precomputed://middleauth+" + origin + "/precomputed/" + view;
  const state = {layers: [{type: layer, source: source, name: view.split("/")[2]}], layout: "xy"};
  window.location.replace("/neuroglancer/#!" + encodeURIComponent(JSON.stringify(state)));
}
""".strip().replace("STORAGE_KEY", STORAGE_KEY).replace("NAME_PATTERN", NAME_PATTERN)
SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (f"default-src 'none'; script-src '{SCRIPT_HASH}'; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")


def share_url(request: HttpRequest, channel: Channel, key: str) -> str:
    """The link that opens `channel` in this server's Neuroglancer as the holder of `key`."""
    exp = channel.experiment
    layer = "segmentation" if channel.type == "annotation" else "image"
    return (f"{own_origin(request)}{SHARE_PATH}#token={key}&view={exp.collection.name}/{exp.name}/{channel.name}"
            f"&layer={layer}")


@require_safe
def share(request: HttpRequest) -> HttpResponse:
    response = render(request, "ndstore/share.html", {"script": SCRIPT})
    response["Content-Security-Policy"] = CSP
    response["X-Frame-Options"] = "DENY"
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    return response


# ndstore.api.urls includes it at the root.
urlpatterns = [path(SHARE_PATH.lstrip("/"), share)]
