"""What an operator and a load balancer see of a running service, ahead of every other middleware:

- `GET /healthz`: 200 `{"status": "ok", "parts": {...}}` when the metadata database, the cache
  and lock Redis, the NDBlaze Redis, the object store and the index all answer; 503 naming each
  part that does not. Answered before host validation and authentication (a load balancer
  probes with its own Host and no token), so it reveals only which part is down (why goes to the
  log), and its answer is reused for HEALTH_TTL_S: a flood of probes costs the stores nothing.
  The parts are probed at once, each in a thread of its own, and the answer waits at most
  PROBE_DEADLINE_S for them: a part that has not answered by then (a stalled server) is named
  failing, and it is not probed again while its probe is still out.
- One log line per request at INFO on `ndstore.requests`: method, route, status, bytes in and
  out, milliseconds, user id; and the same figures into the shared counters of /metrics. What a
  client chose (the path, the method) is escaped in the line and never becomes a metric label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from ndstore.wiring import services

log = logging.getLogger("ndstore.requests")
health_log = logging.getLogger("ndstore.health")
HEALTH_PATH = "/healthz"
HEALTH_TTL_S = 1.0
PROBE_DEADLINE_S = 0.8
_probing: dict[str, Future[None]] = {}  # a part's probe still out (a stalled part's, past the deadline)
_probes = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ndstore-health")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_last_health: tuple[float, int, dict[str, Any]] = (float("-inf"), 0, {})
_health_lock = threading.Lock()
_clock = time.monotonic  # the health answer's age (tests hold it still)


def health() -> tuple[int, dict[str, Any]]:
    """The last answer if it is younger than HEALTH_TTL_S, else every part probed again (one
    thread probes; the others wait for its answer)."""
    global _last_health
    with _health_lock:
        at, status, body = _last_health
        if _clock() - at >= HEALTH_TTL_S:
            status, body = probe_parts()
            _last_health = (_clock(), status, body)
        return status, body


def probe_parts() -> tuple[int, dict[str, Any]]:
    calls: dict[str, Callable[[], object]] = {"database": lambda: connection.cursor().execute("SELECT 1")}
    parts: dict[str, str] = {}
    try:
        calls.update(services().probes)
    except Exception as exc:  # noqa: BLE001 - the services could not even be built
        parts["services"] = "failing"
        health_log.warning("health: the services could not be built: %s: %s", type(exc).__name__, exc)
    for name, call in calls.items():
        if name not in _probing or _probing[name].done():
            _probing[name] = _probes.submit(_probe, name, call)
    wait([_probing[name] for name in calls], timeout=PROBE_DEADLINE_S)
    for name in calls:
        future = _probing[name]
        parts[name] = "ok" if future.done() and future.exception() is None else "failing"
        if not future.done():
            health_log.warning("health: %s has not answered within %.1f s", name, PROBE_DEADLINE_S)
    failing = sorted(name for name, state in parts.items() if state != "ok")
    body = {"status": "ok" if not failing else "failing", "parts": parts}
    if failing:
        body["message"] = f"not answering: {', '.join(failing)}"
    return (503 if failing else 200), body


def _probe(name: str, call: Callable[[], object]) -> None:
    try:
        call()
    except Exception as exc:
        health_log.warning("health: %s does not answer: %s: %s", name, type(exc).__name__, exc)
        raise
    finally:
        if name == "database":
            connection.close()  # the probe's thread keeps no connection of its own open


def route_of(request: HttpRequest) -> str:
    """The view that served the request (a few dozen names: a metrics label, never a path)."""
    match = getattr(request, "resolver_match", None)
    view = getattr(getattr(match, "func", None), "view_class", None) if match else None
    if view is not None:
        return str(view.__name__)
    return {HEALTH_PATH: "healthz", "/_ndstore/admit": "admission"}.get(request.path, "unrouted")


class Operations:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        if request.path == HEALTH_PATH and request.method in ("GET", "HEAD"):
            status, body = health()
            response: HttpResponse = JsonResponse(body, status=status)
            if request.method == "HEAD":  # the status is the answer; a HEAD carries no body
                response = HttpResponse(status=status, content_type=response["Content-Type"])
        else:
            response = self.get_response(request)
        self._record(request, response, time.perf_counter() - started)
        return response

    @staticmethod
    def _record(request: HttpRequest, response: HttpResponse, seconds: float) -> None:
        route, status = route_of(request), response.status_code
        method = request.method if request.method in METHODS else "other"
        bytes_in = int(request.META.get("CONTENT_LENGTH") or 0)
        bytes_out = int(response.get("Content-Length") or 0) if response.streaming else len(response.content)
        identity = getattr(request, "ndstore_identity", None)
        user = identity[0] if identity else getattr(request, "user", None)
        user_id = user.pk if user is not None and user.is_authenticated else "-"
        path = request.path[:200].encode("unicode_escape").decode("ascii")  # no line breaks a client chose
        log.info("%s %s %s %d in=%d out=%d %.1fms user=%s", method, path, route, status, bytes_in, bytes_out,
                 seconds * 1000, user_id)
        try:
            metrics = services().metrics
        except Exception:  # noqa: BLE001 - no Redis to count in: the log line stands alone
            return
        metrics.count("requests_total", route=route, method=method, code=f"{status // 100}xx")
        metrics.observe("request_duration_seconds", seconds, route=route)
        metrics.count("request_bytes_total", bytes_in, route=route, direction="in")
        metrics.count("request_bytes_total", bytes_out, route=route, direction="out")
