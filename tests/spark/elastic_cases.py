"""Run as a script: hora.spark.run_elastic on its own local Spark that retries failed tasks (local[3, 4]).

The shared test session (local[2]) fails a job at a task's first failure;
an elastic job needs Spark to retry the task whose Python worker died. Prints
one ``RESULT {json}`` line: the results, in rank order. With ``--connect``,
the session is a Spark Connect one (pyspark's own local Connect server).
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def main() -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter, which has hora
    import hora.spark
    from pyspark.sql import SparkSession

    from tests.elastic import linear

    if sys.argv[1:] == ["--connect"]:
        with warnings.catch_warnings():  # a local Connect server's static configs are fixed: it says so, harmlessly
            warnings.simplefilter("ignore", UserWarning)
            spark = SparkSession.builder.remote("local[3, 4]").getOrCreate()
        assert type(spark).__module__.startswith("pyspark.sql.connect."), type(spark)
    else:
        spark = (
            SparkSession.builder.master("local[3, 4]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("OFF")
    try:
        env = {"ELASTIC_KILL_INDEX": "2", "ELASTIC_KILL_STEP": "5", "ELASTIC_STEP_SLEEP": "0.3",
               "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # fmt: skip
        # Horovod's names: min_num_proc for min_np, and one NIC.
        results = hora.spark.run_elastic(linear.train_job, num_proc=3, min_num_proc=2, env=env, elastic_timeout=60,
                                         verbose=0, nics={"lo"})  # fmt: skip
        print("RESULT " + json.dumps(results), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
