"""Spark for the engine's batch jobs (the NDBlaze merge, the hierarchy build): a session bound to
loopback with Kryo serialization, and the settings that let a worker build the same services as
the driver, in local mode (`local[*]`) or on any cluster reached by a master URL."""

from __future__ import annotations

import os
import sys
from typing import Any

SETTINGS_PREFIXES = ("NDSTORE_", "AWS_", "MALLOC_")


def spark_session(master: str, app_name: str = "ndstore-blaze-merge") -> Any:
    """A SparkSession with Kryo serialization, bound to loopback, running workers on this
    interpreter (without PYSPARK_PYTHON they would not find numpy)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark picks the host's first address
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.python.worker.reuse", "true"))
    return builder.getOrCreate()


def worker_settings() -> dict[str, str]:
    """The settings a worker needs to build the same services as this process."""
    return {k: v for k, v in os.environ.items() if k.startswith(SETTINGS_PREFIXES)}
