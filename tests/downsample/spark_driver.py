"""A Spark driver in a process of its own, for tests of the hierarchy build on a Spark cluster
(a process holds one SparkContext, and the test process holds a local-mode one): builds the
levels of the pickled channels on the master given, as `ndstore downsample --engine spark` does,
with services built from the NDSTORE_* settings, and prints one JSON result per channel.

    python -m tests.downsample.spark_driver MASTER CHANNELS.pickle
"""

from __future__ import annotations

import json
import pickle
import sys
from functools import partial
from pathlib import Path


def main(master: str, channels_file: str) -> None:
    from ndstore.engine.spark import spark_session
    from ndstore.engine.spark_downsample import build_hierarchy
    from ndstore.wiring import downsampler_for, services

    channels = pickle.loads(Path(channels_file).read_bytes())  # noqa: S301 - written by the test itself
    spark = spark_session(master, "ndstore-downsample")
    try:
        for channel in channels:
            svc = services()
            result = build_hierarchy(spark, channel, svc.downsampler, partial(downsampler_for, svc.config))
            print(json.dumps(result), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
