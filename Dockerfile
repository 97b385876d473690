# One image for the web service and (later) the workers and lambdas.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=ndstore.api.settings.production \
    NDSTORE_BIND=0.0.0.0:8000 \
    MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=268435456 \
    MALLOC_TOP_PAD_=67108864

RUN useradd --create-home --uid 10001 ndstore
WORKDIR /app

COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt

COPY --chown=ndstore:ndstore . .
RUN pip install --no-cache-dir --no-deps -e .

USER ndstore
EXPOSE 8000
CMD ["gunicorn", "-c", "deploy/gunicorn.conf.py", "--bind", "0.0.0.0:8000"]
