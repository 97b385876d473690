"""Settings for deployments: a real secret key and explicit hosts are required."""

import os

from ndstore.api.settings.base import *  # noqa: F403

SECRET_KEY = os.environ["NDSTORE_SECRET_KEY"]
ALLOWED_HOSTS = os.environ["NDSTORE_ALLOWED_HOSTS"].split(",")
DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# Behind a proxy that terminates TLS (nginx, the AWS load balancer; NDSTORE_NUM_PROXIES says one
# is trusted), requests arrive as plain HTTP: trust its X-Forwarded-Proto, or the admin site's
# CSRF check refuses every form posted over HTTPS.
if os.environ.get("NDSTORE_NUM_PROXIES"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
