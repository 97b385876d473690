"""A web worker gets ready for its first request as it starts: it imports its routes and views as
it loads the app, and gunicorn's post_worker_init hook builds its storage services in the
background (a failed build is logged and left to the first request)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ndstore.ops.localstack import ROOT, free_port

# Runs deploy/gunicorn.conf.py's hook as gunicorn does once the worker has loaded the app, waits
# for the background build, and says whether the services were built.
HOOK_PROBE = """
import runpy, threading
from ndstore.wiring import services
runpy.run_path("deploy/gunicorn.conf.py")["post_worker_init"](None)
for thread in threading.enumerate():
    if thread.name == "ndstore-services-build":
        thread.join(60)
print("built" if services.built else "not built")
"""


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_loading_the_app_imports_the_routes_and_the_views() -> None:
    probe = ("import sys; import ndstore.api.wsgi; "
             "print(' '.join(m for m in ('ndstore.api.urls', 'ndstore.api.views.cutout', "
             "'ndstore.api.views.precomputed', 'rest_framework.views', 'drf_spectacular.views') "
             "if m not in sys.modules))")
    done = _run(probe, {"DJANGO_SETTINGS_MODULE": "ndstore.api.settings.test"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"not imported when the app loaded: {done.stdout.strip()}"


def test_the_worker_hook_builds_the_services_in_the_background(tmp_path: Path, redis_url: str) -> None:
    done = _run(HOOK_PROBE, {"NDSTORE_DATA_DIR": str(tmp_path), "NDSTORE_REDIS_URL": redis_url,
                             "NDSTORE_BLAZE_REDIS_URL": redis_url})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built", done.stderr


def test_a_build_that_fails_at_start_is_logged_and_left_to_the_first_request(tmp_path: Path,
                                                                            redis_url: str) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # an object store that does not answer
    done = _run(HOOK_PROBE, {"NDSTORE_DATA_DIR": str(tmp_path), "NDSTORE_REDIS_URL": redis_url,
                             "NDSTORE_BLAZE_REDIS_URL": redis_url, "NDSTORE_OBJECT_STORE": "s3",
                             "NDSTORE_S3_ENDPOINT_URL": nobody, "NDSTORE_AWS_TIMEOUT_S": "1",
                             "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                             "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"})
    assert done.returncode == 0, done.stderr  # the worker goes on
    assert done.stdout.strip() == "not built"
    assert "services not built at start (the first request builds them)" in done.stderr
