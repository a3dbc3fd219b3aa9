"""The local Spark session the tests (and the notebooks' kernel) use: 2 task slots, loopback only."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_spark"]


def local_spark(app: str) -> Any:
    """A local[2] SparkSession named ``app`` whose executors run this interpreter, bound to 127.0.0.1."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter, which has hora
    session = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
