"""Attackers' fixtures: the API fixtures (the service wired to moto and Redis, users with tokens),
and a WSGI call that counts how much of a request body the service read."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.api.conftest import _wired, admin, dataset, grant  # noqa: F401  (fixtures for this folder)


class CountingBody(io.RawIOBase):
    """A request body of `length` bytes that is never built: it counts what was read of it."""

    def __init__(self, length: int):
        self.length, self.read_bytes = length, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.length - self.read_bytes)
        memoryview(buffer).cast("B")[:n] = b"[" * n  # only ever reached by a service that reads the body
        self.read_bytes += n
        return n


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes
    read_when_answered: int = 0  # bytes of a CountingBody read when the status was set

    def json(self) -> Any:
        return json.loads(self.body)


def wsgi(method: str, path: str, body: CountingBody | bytes = b"", token: str | None = None,
         content_type: str = "application/json", query: str = "", extra: dict[str, str] | None = None,
         app: Any = None) -> Answer:
    """One request through the whole Django stack (every middleware), as gunicorn hands it over;
    ``app``: the WSGI application to call (Django's handler by default)."""
    from django.core.handlers.wsgi import WSGIHandler

    stream = body if isinstance(body, CountingBody) else io.BytesIO(body)
    length = body.length if isinstance(body, CountingBody) else len(body)
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
               "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "REMOTE_ADDR": "127.0.0.1", "CONTENT_LENGTH": str(length), "CONTENT_TYPE": content_type,
               "wsgi.input": stream, "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
               "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0)}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Token {token}"
    environ.update(extra or {})
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=int(status.split()[0]), headers=dict(headers),
                       read=body.read_bytes if isinstance(body, CountingBody) else 0)

    chunks = (app or WSGIHandler())(environ, start_response)
    data = b"".join(chunks)
    getattr(chunks, "close", lambda: None)()
    return Answer(started["status"], started["headers"].get("Content-Type", ""), data, started["read"])


def token_for(username: str, **flags: Any) -> tuple[Any, str]:
    from django.contrib.auth.models import User

    from ndstore.api.models import ApiToken

    user = User.objects.create(username=username, **flags)
    return user, ApiToken.mint(user)[1]


def admin_session(data_dir: Path) -> requests.Session:
    """A session with the admin token of the `ndstore up` stack whose data dir is `data_dir`."""
    s = requests.Session()
    s.headers["Authorization"] = f"Token {(data_dir / 'admin_token').read_text().strip()}"
    return s


def public_dataset(s: requests.Session, url: str, name: str, frame: tuple[int, int, int],
                   channels: dict[str, dict[str, str]]) -> None:
    """Over HTTP: a frame, a public collection `name`, its experiment `e` (one level) and
    `channels` (name -> fields), each answered 201."""
    x, y, z = frame
    experiment = f"{url}/v1/collection/{name}/experiment/e"
    steps = [(f"{url}/v1/coord/{name}_f/", {"x_stop": x, "y_stop": y, "z_stop": z}),
             (f"{url}/v1/collection/{name}/", {"public": True}),
             (f"{experiment}/", {"coord_frame": f"{name}_f", "num_hierarchy_levels": 1, "public": True}),
             *((f"{experiment}/channel/{ch}/", {**fields, "public": True}) for ch, fields in channels.items())]
    for path, body in steps:
        r = s.post(path, json=body, timeout=60)  # a loaded host may be busy writing back what a test before wrote
        assert r.status_code == 201, (path, r.status_code, r.text)


def strict_page_policy(page: Any) -> tuple[str, str]:
    """Checks a page that holds or hands out a token (login, share): exactly one inline script,
    the only one its Content-Security-Policy lets run (by hash), nothing else loaded, never
    framed, cached or sent as a referrer. Answers the policy and the script, for the page's own checks."""
    assert page.status_code == 200
    csp = page["Content-Security-Policy"]
    scripts = re.findall(r"<script>(.*?)</script>", page.content.decode(), re.S)
    assert len(scripts) == 1
    digest = "sha256-" + base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src '{digest}'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "form-action 'none'" in csp
    assert page["X-Frame-Options"] == "DENY" and page["Cache-Control"] == "no-store"
    assert page["Referrer-Policy"] == "no-referrer"
    return str(csp), scripts[0]
