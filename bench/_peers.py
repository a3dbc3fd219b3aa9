"""Launching benchmark workers: Hora through horarun, torch.distributed gloo by hand, MPI through mpiexec.

Each worker prints one ``RESULT <json>`` line from rank 0; :func:`run_peer`
returns the parsed object.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpiexec() -> str | None:
    """The mpiexec horarun --mpi uses (the ``mpich`` wheel's beside this interpreter, or PATH's), if mpi4py is
    installed."""
    from hora.mpi import mpi_available
    from hora.runner.mpi_launch import find_mpiexec

    if not mpi_available():
        return None
    try:
        return find_mpiexec()
    except ValueError:
        return None


def run_peer(kind: str, ranks: int, argv: list[str], env: dict[str, str] | None = None) -> object:
    """Runs ``argv`` as ``ranks`` workers of ``kind`` ("hora", "gloo" or "mpi") and returns rank 0's RESULT."""
    # Idle BLAS threads spin for a while after numpy's start; on a small host they steal the
    # peers' cores. One thread for every peer alike.
    environ = dict(os.environ, **(env or {}))
    environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if kind in ("hora", "mpi"):
        launcher = [sys.executable, "-m", "hora.runner"] if kind == "hora" else [mpiexec() or "mpiexec"]
        command = [*launcher, "-np", str(ranks), *argv]
        out = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True, env=environ).stdout
    else:
        port = free_port()
        procs = []
        for rank in range(ranks):
            worker_env = dict(
                environ,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(rank),
                WORLD_SIZE=str(ranks),
                GLOO_SOCKET_IFNAME="lo",
            )
            procs.append(subprocess.Popen(argv, env=worker_env, stdout=subprocess.PIPE, text=True))
        out = "".join(p.communicate(timeout=1800)[0] for p in procs)
        if any(p.returncode for p in procs):
            raise RuntimeError(f"gloo workers failed: {[p.returncode for p in procs]}")
    for line in out.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{kind} produced no result:\n{out}")


def human(nbytes: int) -> str:
    """4096 -> '4 KiB'."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def median_time(fn: Callable[[], object], iterations: int, sync: Callable[[], object], warmup: int = 5) -> float:
    """Median seconds of ``fn()`` over ``iterations`` calls, after ``warmup`` calls and a ``sync()``."""
    for _ in range(min(warmup, iterations)):
        fn()
    sync()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def alternate(ways: dict[str, Callable[[], T]], repeat: int) -> dict[str, list[T]]:
    """Runs every way once per repeat, in turn, and returns each way's results in repeat order.

    This machine has slow and fast phases that last tens of seconds, longer
    than one launch: ways launched one after another can land in different
    phases (the no-exchange ceiling of one model moved 16k -> 29k samples/s
    between two runs). Alternating the ways and dividing within a repeat
    compares launches made moments apart.
    """
    if repeat < 1:
        raise ValueError(f"--repeat must be at least 1, got {repeat}.")
    results: dict[str, list[T]] = {way: [] for way in ways}
    for _ in range(repeat):
        for way, run in ways.items():
            results[way].append(run())
    return results


def ratio_cell(numerators: list[float], denominators: list[float]) -> str:
    """The median of the repeats' ratios, and their range when there are several: '0.72 (0.69-0.75)'."""
    ratios = sorted(n / d for n, d in zip(numerators, denominators, strict=True))
    median = statistics.median(ratios)
    return f"{median:.2f}" if len(ratios) == 1 else f"{median:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def training_rows(
    results: dict[str, list[float]], single: str, ceiling: str, processes: dict[str, int]
) -> list[list[str]]:
    """Table cells per way: processes, median samples/s, scaling efficiency and share of the ceiling.

    ``results`` holds total samples/s per repeat (from :func:`alternate`);
    scaling efficiency divides by ``processes`` times the ``single``
    process's rate of the same repeat, and the share divides by the
    ``ceiling`` way's rate of the same repeat.
    """
    rows = []
    for way, totals in results.items():
        n = processes[way]
        alone = [n * rate for rate in results[single]]
        share = "-" if way == single else ratio_cell(totals, results[ceiling])
        rows.append([way, str(n), f"{statistics.median(totals):.0f}", ratio_cell(totals, alone), share])
    return rows


def local_spark() -> object:
    """A quiet local Spark session with 2 task slots on loopback, whose executors run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
