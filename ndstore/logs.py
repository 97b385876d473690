"""Logging of every NDStore process but the web workers (whose Django settings say the same):
our own loggers at NDSTORE_LOG_LEVEL (INFO), the libraries' at NDSTORE_LIBRARY_LOG_LEVEL
(WARNING), one line per record. `ndstore up -v` lowers both."""

from __future__ import annotations

import logging
import os

LIBRARIES = ("botocore", "boto3", "urllib3", "s3transfer", "py4j", "pyspark", "werkzeug", "moto", "gunicorn",
             "numexpr")
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class AnsweredOnPurpose(logging.Filter):
    """Drops Django's ERROR line for a 503 or 507 that our error mapping chose and logged
    already (a store that is full, down or lost data): one line per fault, not two. An
    unexpected 500 keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "status_code", None) not in (503, 507)


def configure() -> None:
    logging.basicConfig(level=os.environ.get("NDSTORE_LOG_LEVEL", "INFO"), format=FORMAT, force=True)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(os.environ.get("NDSTORE_LIBRARY_LOG_LEVEL", "WARNING"))
