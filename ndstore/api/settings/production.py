"""Settings for deployments: a real secret key and explicit hosts are required."""

import os

from ndstore.api.settings.base import *  # noqa: F403

SECRET_KEY = os.environ["NDSTORE_SECRET_KEY"]
ALLOWED_HOSTS = os.environ["NDSTORE_ALLOWED_HOSTS"].split(",")
DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# Behind a proxy that terminates TLS, its X-Forwarded-Proto is trusted: base.py.
