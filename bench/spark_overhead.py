"""Start-up overhead of hora.spark.run against TorchDistributor, and reader throughput against Petastorm.

1. Wall time of ``hora.spark.run`` of a trivial function (one allreduce of
   one number) on 2 processes, against ``pyspark.ml.torch.distributor.
   TorchDistributor`` running the same function (its own gloo process
   group and all_reduce) on 2 processes, in the same local Spark session,
   alternating, median of the repeats.
2. Rows/s of one full pass over a Parquet dataset (100,000 rows: an id, a
   784-float feature array and a label) with Hora's Arrow shard reader and,
   where petastorm is installed (the pyspark 3.5 / pyarrow 14 stack), with
   Petastorm's ``make_batch_reader``; same files, same run.

    python bench/spark_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from _peers import local_spark

ROWS = 100_000
FEATURES = 784


def hora_fn() -> float:
    import hora
    import numpy as np

    return float(hora.allreduce(np.array([1.0]), op=hora.Sum)[0])


def torch_fn() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value[0])


def startup(spark, repeats: int) -> dict[str, float]:
    import hora.spark
    from pyspark.ml.torch.distributor import TorchDistributor

    ways = {
        "hora.spark.run": lambda: hora.spark.run(hora_fn, num_proc=2, spark=spark, verbose=0),
        "TorchDistributor": lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(torch_fn),
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    for call in ways.values():  # one warm-up each: Python workers, imports
        call()
    for _ in range(repeats):
        for way, call in ways.items():
            started = time.perf_counter()
            call()
            times[way].append(time.perf_counter() - started)
    return {way: statistics.median(values) for way, values in times.items()}


def write_dataset(directory: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    per_file = ROWS // 4
    for part in range(4):
        ids = np.arange(part * per_file, (part + 1) * per_file)
        features = rng.standard_normal((per_file, FEATURES), dtype=np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), FEATURES).cast(
            pa.list_(pa.float32())
        )
        table = pa.table({"id": ids, "features": column, "label": (ids % 10).astype(np.int64)})
        pq.write_table(table, os.path.join(directory, f"part-{part}.parquet"), row_group_size=5_000)


def reader_throughput(directory: str, batch_size: int) -> dict[str, float]:
    from hora.spark import ShardReader

    results = {}
    started = time.perf_counter()
    reader = ShardReader(None, directory, rank=0, size=1, batch_size=batch_size)
    rows = sum(len(batch["id"]) for batch in reader.numpy_batches())
    results["hora ShardReader"] = rows / (time.perf_counter() - started)
    try:
        from petastorm import make_batch_reader
    except ImportError:
        return results
    started = time.perf_counter()
    rows = 0
    with make_batch_reader(f"file://{directory}", num_epochs=1, workers_count=1) as reader:
        for batch in reader:
            rows += len(batch.id)
    results["petastorm make_batch_reader"] = rows / (time.perf_counter() - started)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    parser.add_argument("--skip-startup", action="store_true", help="reader throughput only")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"{os.cpu_count()} cores; load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if not args.skip_startup:
        spark = local_spark()
        medians = startup(spark, 3 if args.quick else 7)
        spark.stop()
        hora_time = medians["hora.spark.run"]
        print("\n| way (2 processes, trivial function with one allreduce) | median wall time | vs hora |")
        print("|---|---|---|")
        for way, seconds in medians.items():
            print(f"| {way} | {seconds:.2f} s | {seconds / hora_time:.2f}x |")
    with tempfile.TemporaryDirectory() as directory:
        write_dataset(directory)
        throughput = reader_throughput(directory, 256)
    base = throughput["hora ShardReader"]
    print(f"\n| reader ({ROWS} rows x {FEATURES} float32, batch 256, one pass) | rows/s | vs hora |")
    print("|---|---|---|")
    for way, rate in throughput.items():
        print(f"| {way} | {rate:,.0f} | {rate / base:.2f}x |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
