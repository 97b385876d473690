"""gunicorn settings for the web service (used by `ndstore up`, the Dockerfile and compose).

gthread workers keep connections alive between requests (the sync worker closes each one).
"""

import multiprocessing
import os

bind = os.environ.get("NDSTORE_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("NDSTORE_WEB_WORKERS", str(max(2, multiprocessing.cpu_count()))))
worker_class = "gthread"
threads = int(os.environ.get("NDSTORE_WEB_THREADS", "4"))
timeout = int(os.environ.get("NDSTORE_WEB_TIMEOUT", "300"))
keepalive = 30
graceful_timeout = 30
accesslog = os.environ.get("NDSTORE_ACCESS_LOG") or None  # the service logs one line per request itself
loglevel = os.environ.get("NDSTORE_LIBRARY_LOG_LEVEL", "warning").lower()
wsgi_app = "ndstore.api.wsgi:application"
# The front (nginx) bounds request lines and headers (16 KiB a line, 64 KiB in all) and answers
# past them in JSON; gunicorn's own, smaller limits would answer what the front let through with
# an HTML page.
limit_request_line = 0
limit_request_field_size = 0
limit_request_fields = 32768

# glibc reads MALLOC_* tuning only at process start, so it cannot be set here: `ndstore up`,
# the Dockerfile and compose put MALLOC_ARENA_MAX/MMAP_THRESHOLD_/TRIM_THRESHOLD_/TOP_PAD_ in the
# environment gunicorn starts with (see ndstore.ops.localstack.MALLOC_TUNING).

# Several stacks (tests, benchmarks) may run side by side; a shared control socket in $HOME
# would collide between them.
control_socket_disable = True


def post_worker_init(worker: object) -> None:
    """Once the worker has loaded the app, move everything it loaded (Django, the engine, the
    libraries: objects by the hundred thousand, living as long as the worker) out of the garbage
    collector's sight, so its collections scan what requests made. Measured (docs/design/serving.md,
    "gunicorn workers"): small-read latency p50 ~5% lower; tails unchanged beyond this host's noise.
    Then build the storage services in the background, not in the worker's first request."""
    import gc

    from ndstore.wiring import build_in_background

    del worker
    gc.freeze()
    build_in_background()
