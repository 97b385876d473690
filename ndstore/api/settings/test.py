"""Settings for the test suite: fast password hashing, no persistent connections."""

from ndstore.api.settings.base import *  # noqa: F403
from ndstore.api.settings.base import DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DATABASES["default"]["CONN_MAX_AGE"] = 0
