"""Hora on Spark: distributed training where the data already is.

- ``hora.spark.run(fn, num_proc=4)`` runs ``fn`` on four Spark tasks at once
  (a barrier stage), each a Hora rank, and returns the results in rank order.
- ``hora.spark.run_elastic(fn, num_proc=4, min_np=2)`` runs an elastic
  training function (``hora.elastic``) on tasks that Spark retries one by one.
- ``hora.spark.log_metrics(metrics, step)`` inside ``fn``: rank 0's metrics
  into the driver's active MLflow run.
- ``hora.spark.Store.create(path)`` is where a run's data, checkpoints and logs live.
- ``hora.spark.write_parquet(df, store, path)`` and ``hora.spark.ShardReader``
  turn a DataFrame into each rank's batches (Arrow, numpy, torch, tf.data).
- ``hora.spark.make_spark_converter(df)`` does both, cached, Petastorm-style.

pyspark, pyarrow and the frameworks are imported only when a function needs them.
"""

from hora.spark.barrier import run
from hora.spark.converter import SparkDatasetConverter, make_spark_converter
from hora.spark.dataframes import check_columns, write_parquet
from hora.spark.elastic import run_elastic
from hora.spark.shards import ShardReader
from hora.spark.store import DBFSStore, FsspecStore, LocalStore, Store, VolumeStore
from hora.spark.tracking import log_metrics

__all__ = [
    "DBFSStore",
    "FsspecStore",
    "LocalStore",
    "ShardReader",
    "SparkDatasetConverter",
    "Store",
    "VolumeStore",
    "check_columns",
    "log_metrics",
    "make_spark_converter",
    "run",
    "run_elastic",
    "write_parquet",
]
