"""Hora on Spark: distributed training where the data already is.

``hora.spark.run(fn, num_proc=4)`` runs ``fn`` on four Spark tasks at once
(a barrier stage), each a Hora rank, and returns the results in rank order.
pyspark is imported only when a function that needs it runs.
"""

from hora.spark.barrier import run

__all__ = ["run"]
