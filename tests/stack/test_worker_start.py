"""A web worker imports its routes and views as it loads the app, before its first request."""

from __future__ import annotations

import os
import subprocess
import sys

from ndstore.ops.localstack import ROOT


def test_loading_the_app_imports_the_routes_and_the_views() -> None:
    probe = ("import sys; import ndstore.api.wsgi; "
             "print(' '.join(m for m in ('ndstore.api.urls', 'ndstore.api.views.cutout', "
             "'ndstore.api.views.precomputed', 'rest_framework.views', 'drf_spectacular.views') "
             "if m not in sys.modules))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ndstore.api.settings.test"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"not imported when the app loaded: {done.stdout.strip()}"
