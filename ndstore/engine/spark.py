"""Spark for the engine's batch jobs (the NDBlaze merge, the hierarchy build): a session bound to
loopback with Kryo serialization, in local mode (`local[*]`) or on any cluster reached by a
master URL. Workers build their services from the Config the driver sends with each task (a
value: see ndstore.wiring.services_for), never from their own environment."""

from __future__ import annotations

import os
import sys
from typing import Any


def spark_session(master: str, app_name: str = "ndstore-blaze-merge") -> Any:
    """A SparkSession with Kryo serialization, running workers on this interpreter (without
    PYSPARK_PYTHON they would not find numpy). The driver binds to SPARK_LOCAL_IP and tells
    executors to reach it at SPARK_LOCAL_HOSTNAME (Spark's own variables): loopback unless they
    are set, as where executors run on other hosts (docker-compose.yml: 0.0.0.0 and `merger`)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark picks the host's first address
    bind = os.environ["SPARK_LOCAL_IP"]
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
               .config("spark.driver.host", os.environ.get("SPARK_LOCAL_HOSTNAME", bind))
               .config("spark.driver.bindAddress", bind)
               .config("spark.ui.enabled", "false")
               .config("spark.python.worker.reuse", "true"))
    return builder.getOrCreate()
