"""Settings shared by every deployment. Values come from the environment (see ndstore.config)."""

from __future__ import annotations

import os

import dj_database_url

from ndstore.config import Config
from ndstore.logs import LIBRARIES

CONFIG = Config.from_env()

SECRET_KEY = os.environ.get("NDSTORE_SECRET_KEY", "insecure-local-only-key")
DEBUG = os.environ.get("NDSTORE_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("NDSTORE_ALLOWED_HOSTS", "*").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here: the docs page works offline
    "ndstore.api",
]

MIDDLEWARE = [
    "ndstore.api.latest.LatestIsV1",  # /latest/... is /v1/... for everything below
    "ndstore.api.operations.Operations",  # /healthz (before host checks) and the per-request log line
    "ndstore.api.admission.Admission",  # the front's auth_request: may this body be read? (before host checks)
    "ndstore.api.data_routes.DataRoutes",  # cutouts without the rest of this list's control-plane parts, nor DRF
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # the admin's and the docs page's static files
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "ndstore.api.meta_cache.RequestGeneration",
    "ndstore.api.audit.AuditMiddleware",
    "ndstore.api.gate.RequestGate",  # no body is read before this: see ndstore/api/gate.py
    "ndstore.api.browser_http.BrowserHTTP",  # CORS, ETag, Range, HEAD on the data GETs
]

# The cutout routes' short path (ndstore/api/data_routes.py); 0 sends them through DRF's dispatch too.
NDSTORE_LEAN_DATA_ROUTES = os.environ.get("NDSTORE_LEAN_DATA_ROUTES", "1") != "0"

# Behind the front (which sets NDSTORE_NUM_PROXIES for gunicorn and sets X-Forwarded-Proto itself),
# a request that came over https is https: the middleauth+ login hands its token to an https
# Neuroglancer, and the admin's CSRF check accepts forms posted over https.
if os.environ.get("NDSTORE_NUM_PROXIES"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

ROOT_URLCONF = "ndstore.api.urls"
WSGI_APPLICATION = "ndstore.api.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{CONFIG.data_dir / 'meta.sqlite3'}", conn_max_age=60
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "ndstore.api.postgres"  # each call bounded by NDSTORE_DB_TIMEOUT_S
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "/static/"
# Served by WhiteNoise straight from the apps' static folders: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True
USE_TZ = True
TIME_ZONE = "UTC"

# Cutout bodies are read by the array parsers, which enforce NDSTORE_MAX_BODY_BYTES (413); JSON
# bodies by ndstore.api.json_body (1 MiB). This caps what Django itself buffers: the admin's forms.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1 << 20

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ndstore.api.auth.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["ndstore.api.json_body.StrictJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "ndstore.api.negotiation.NamedFormatNegotiation",
    "EXCEPTION_HANDLER": "ndstore.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["ndstore.api.throttling.AnonymousReadThrottle"],
    # X-Forwarded-For hops to trust when identifying a client (1 behind the compose nginx)
    "NUM_PROXIES": int(os.environ["NDSTORE_NUM_PROXIES"]) if os.environ.get("NDSTORE_NUM_PROXIES") else None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "NDStore API",
    "DESCRIPTION": "Tiered storage for petascale 3-D image volumes: resources (Boss v1 shapes), cutouts "
                   "through the cache tier, direct to the base tier or into the NDBlaze buffer, slice "
                   "images, Neuroglancer precomputed, ingest and downsampling. Authenticate with "
                   "`Authorization: Token <key>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/v1/",  # tags and operation ids from the part after it: collection, cutout, ...
    "COMPONENT_SPLIT_REQUEST": True,  # request bodies without the read-only fields of the responses
    # two choice sets of fields named `level`: a grant's and a scoped token's
    "ENUM_NAME_OVERRIDES": {"LevelEnum": ["read", "write", "admin"], "TokenLevelEnum": ["read", "write"]},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "ndstore.api.schema.describe_path_parameters",
                             "ndstore.api.schema.distinct_operation_ids",
                             "ndstore.api.schema.describe_browser_http"],
}

# Our own loggers at NDSTORE_LOG_LEVEL (INFO: one line per request, `ndstore.requests`); the
# libraries' at NDSTORE_LIBRARY_LOG_LEVEL (WARNING: no start-up chatter; `ndstore up -v` lowers both).
_LIBRARY_LEVEL = os.environ.get("NDSTORE_LIBRARY_LOG_LEVEL", "WARNING")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"line": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"answered_on_purpose": {"()": "ndstore.logs.AnsweredOnPurpose"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "root": {"handlers": ["console"], "level": os.environ.get("NDSTORE_LOG_LEVEL", "INFO")},
    # Not "gunicorn": dictConfig resets the children of every logger it names, which would strip
    # gunicorn.access of its handler (NDSTORE_ACCESS_LOG); gunicorn sets its own levels (loglevel).
    "loggers": {**{name: {"level": _LIBRARY_LEVEL}
                   for name in (*LIBRARIES, "django", "drf_spectacular") if name != "gunicorn"},
                # 4xx are in our request line; a 500 keeps its traceback; our 503/507 logged once
                "django.request": {"level": "ERROR", "filters": ["answered_on_purpose"]}},
}
