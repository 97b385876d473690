# One image for the web nodes, the daemons, the NDBlaze merger, the ingest runner and the Spark
# master and worker of docker-compose.yml (pyspark's `spark-class` is on PATH).

# Neuroglancer's static build (deploy/neuroglancer/install.sh, pinned by its package-lock.json),
# served at /neuroglancer/; only the built site enters the image, not Node.js.
FROM node:20-bookworm-slim AS neuroglancer
WORKDIR /build
COPY deploy/neuroglancer ./deploy/neuroglancer
RUN NDSTORE_NEUROGLANCER_DIR=/neuroglancer bash deploy/neuroglancer/install.sh

FROM python:3.11-slim-bookworm

# glibc reads MALLOC_* only at process start: keep large cutout buffers resident instead of
# mmap/munmap-ing them per request, in one arena so that what is kept stays bounded (the same
# values `ndstore up` sets, ndstore.ops.localstack.MALLOC_TUNING).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=ndstore.api.settings.production \
    NDSTORE_DATA_DIR=/var/lib/ndstore \
    MALLOC_ARENA_MAX=1 \
    MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=268435456 \
    MALLOC_TOP_PAD_=67108864 \
    PYSPARK_PYTHON=/usr/local/bin/python \
    NDSTORE_NEUROGLANCER_DIR=/app/neuroglancer

# A JRE for Spark: the merger's driver (pyspark runs its JVM), the master, workers and executors;
# nginx, the web node's front (`ndstore serve`: slow clients cost it a socket, not a worker), with
# its stream module (it counts connections per address where the node faces clients directly);
# openssl, with which docker-compose.yml's `tls` service makes compose's nginx a certificate.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless nginx-light libnginx-mod-stream openssl \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 ndstore \
    && mkdir -p /var/lib/ndstore/ingest \
    && chown -R ndstore:ndstore /var/lib/ndstore
WORKDIR /app

COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt

# The repository's runtime parts, listed so that a local .venv or data dir never enters the image.
COPY pyproject.toml README.md ./
COPY ndstore ./ndstore
COPY blaze ./blaze
COPY lambdas ./lambdas
COPY deploy ./deploy
COPY --from=neuroglancer /neuroglancer ./neuroglancer
RUN pip install --no-cache-dir --no-deps -e .

USER 10001:10001
EXPOSE 8000
# nginx on 8000 reads whole requests and takes whole responses (with timeouts) for gunicorn, which
# listens on a Unix socket under $NDSTORE_DATA_DIR/front (ndstore/ops/front.py).
CMD ["ndstore", "serve", "--bind", "0.0.0.0:8000"]
