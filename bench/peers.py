"""Allreduce against the peers, side by side in one run: Hora (also its engine alone, and other paths), gloo, MPI.

For 2 and 4 ranks on this host, float32 sum, in place, 4 KiB to 256 MiB:
median time per call (synchronous: each call returns with the result),
bus bandwidth (2(n-1)/n * bytes / time), and how many times faster Hora
(auto: shared memory within the host) is than each peer. memcpy bandwidth
of the same sizes, measured in the same run, is the physical reference.
The machine's load average is printed before and after.

A second table gives, for the small sizes, rank 0's CPU time per call (all
its threads, spinning waiters included). With more ranks than cores, a call
cannot take less than the ranks' CPU time for it shared over the cores: there
that, not the waiting, is what a small call costs. "hora engine" is the same
allreduce as a request built once and run straight on the engine: what
``hora.allreduce_`` costs beyond the engine's own work is the difference.

Where ranks outnumber cores, the first tenths of a second of a launch are
the scheduler's: 4 ranks on the 2 cores can start 3 on one core and 1 on
the other, which took a 4 KiB allreduce from ~21 to 33-70 us for the first
130 ms of a launch here (the lone rank spins on its own core). Every peer
therefore runs SETTLE_SECONDS of small calls before it times anything.

With ``--repeat N`` every peer runs N times, the peers in turn, so that
each comparison is between launches made moments apart (this machine has
slow and fast phases longer than a launch, and with more ranks than cores a
launch's placement moves small calls by up to 2x): a cell's time is the
median of its repeats, and "how many times faster" is the median of the
repeats' ratios, their range in brackets. ``--peers`` picks the columns
(Hora's own is always run).

    python bench/peers.py [--quick] [--ranks 2,4] [--repeat N] [--peers hora,mpi]

Every peer runs in its own processes, launched the way its users launch it:
Hora through horarun, gloo with torch.distributed's environment rendezvous
on 127.0.0.1, MPI (mpi4py and the ``mpich`` wheel, ``pip install 'hora[mpi]'``)
through mpiexec; a peer that is not installed is reported and skipped.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _peers import alternate, human, median_time, mpiexec, ratio_cell, run_peer

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
CPU_TABLE_BYTES = 64 << 10  # the CPU table's largest size

# column name -> (launcher kind, extra environment)
PEERS = {
    "hora": ("hora", {}),
    "hora engine": ("hora", {"PEERS_ENGINE_ONLY": "1"}),
    "hora ring copy": ("hora", {"HORA_SHM_SINGLE_COPY": "0"}),
    "hora tcp": ("hora", {"HORA_TRANSPORT": "tcp"}),
    "gloo": ("gloo", {}),
    "mpi": ("mpi", {"FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo"}),
}


# One launch of a peer: rank 0's median seconds per call ("median") and CPU seconds per call ("cpu") by size, or
# why it did not run (see _run()).
Result = dict[str, dict[int, float]] | str

SETTLE_SECONDS = 0.3  # of small calls before the timed ones (see the module's docstring)


def _iterations(seconds_per_call: float, quick: bool) -> int:
    budget = 0.1 if quick else 1.0  # seconds of calls per size and peer, roughly
    return int(min(max(budget / max(seconds_per_call, 1e-6), 5), 3000))


def _engine_only() -> Callable[[Any], None]:
    """Hora's allreduce as the engine alone runs it: one request per buffer, built once, run on the engine."""
    from hora import _native
    from hora.basics import current_job

    engine, requests = current_job().engine, {}

    def run(buffer: Any) -> None:
        request = requests.get(id(buffer))
        if request is None:
            kind, op = _native.RequestKind.ALLREDUCE, _native.ReduceOp.SUM
            request = requests[id(buffer)] = _native.Request(kind, f"peers.{buffer.nbytes}", buffer, op=op)
        engine.run(request)

    return run


def _worker(kind: str, sizes: list[int], quick: bool) -> None:
    import numpy as np

    finish = None
    if kind == "hora":
        import hora

        hora.init()
        rank = hora.rank()

        def run(buffer: np.ndarray) -> None:
            hora.allreduce_(buffer, op=hora.Sum)

        if os.environ.get("PEERS_ENGINE_ONLY"):
            run = _engine_only()

        def sync() -> None:
            hora.barrier()

        def agree(count: int) -> int:
            return int(hora.allreduce(np.array([count]), op=hora.Max)[0])

    elif kind == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def run(buffer: np.ndarray) -> None:
            dist.all_reduce(torch.from_numpy(buffer))

        def sync() -> None:
            dist.barrier()

        def agree(count: int) -> int:
            tensor = torch.tensor([count])
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            return int(tensor.item())

        def finish() -> None:
            dist.barrier()
            dist.destroy_process_group()

    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()

        def run(buffer: np.ndarray) -> None:
            comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

        def sync() -> None:
            comm.Barrier()

        def agree(count: int) -> int:
            return comm.allreduce(count, op=MPI.MAX)

    settle = functools.partial(run, np.ones(1024, dtype=np.float32))
    for _ in range(agree(int(SETTLE_SECONDS / max(median_time(settle, 3, sync), 1e-6)))):
        settle()
    medians, cpu = {}, {}
    for nbytes in sizes:
        buffer = np.ones(nbytes // 4, dtype=np.float32)
        call = functools.partial(run, buffer)
        probe = median_time(call, 3, sync)  # also the warm-up
        # Every rank runs the same number of calls: the most any rank's probe asks for.
        calls = agree(_iterations(probe, quick))
        started = time.process_time()
        medians[nbytes] = median_time(call, calls, sync, warmup=0)
        cpu[nbytes] = (time.process_time() - started) / calls
    if rank == 0:
        print("RESULT " + json.dumps({"median": medians, "cpu": cpu}), flush=True)
    if finish is not None:
        finish()


def memcpy_times(sizes: list[int], quick: bool) -> dict[int, float]:
    """Median seconds to copy each size once with numpy (one core, out of place)."""
    import numpy as np

    times = {}
    for nbytes in sizes:
        source = np.ones(nbytes // 4, dtype=np.float32)
        target = np.empty_like(source)
        call = functools.partial(np.copyto, target, source)
        probe = median_time(call, 3, lambda: None)
        times[nbytes] = median_time(call, _iterations(probe, quick), lambda: None, warmup=0)
    return times


def _run(column: str, ranks: int, sizes: list[int], quick: bool) -> Result:
    """One launch of the peer ``column``: its :data:`Result`."""
    kind, env = PEERS[column]
    if kind == "mpi" and mpiexec() is None:
        return "not installed: pip install 'hora[mpi]'"
    argv = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--sizes", ",".join(map(str, sizes))]
    if quick:
        argv.append("--quick")
    try:
        result = run_peer(kind, ranks, argv, env)
        return {what: {int(k): v for k, v in result[what].items()} for what in ("median", "cpu")}
    except Exception as exc:  # one peer failing must not hide the others
        return f"failed: {str(exc).splitlines()[0][:80]}"


def _merged(runs: list[Result]) -> Result:
    """The repeats of one peer as one result: each figure the median of its repeats (or the first failure)."""
    done = [run for run in runs if not isinstance(run, str)]
    if len(done) < len(runs):
        return next(run for run in runs if isinstance(run, str))
    return {
        what: {n: statistics.median(run[what][n] for run in done) for n in done[0][what]} for what in ("median", "cpu")
    }


def table(
    ranks: int,
    sizes: list[int],
    memcpy: dict[int, float],
    repeats: dict[str, list[Result]],
    merged: dict[str, Result],
) -> str:
    """The time table: ``repeats`` holds each peer's runs in repeat order, ``merged`` each peer's :func:`_merged`."""
    factor = 2 * (ranks - 1) / ranks
    own = [run for run in repeats["hora"] if not isinstance(run, str)]
    hora = merged["hora"]
    assert len(own) == len(repeats["hora"]) and not isinstance(hora, str), repeats["hora"]
    width = 24 if len(own) == 1 else 36
    head = f"| {'size':>7} | {'memcpy':>7} | {'hora':>16} |"
    rule = f"|{'-' * 9}|{'-' * 9}|{'-' * 18}|"
    for column in repeats:
        if column != "hora":
            head += f" {column:>{width}} |"
            rule += f"{'-' * (width + 2)}|"
    lines = [
        f"{ranks} ranks: median per call; GB/s = bus bandwidth; memcpy = one-core copy GB/s; "
        "'N.NNx' = how many times faster Hora is"
        + ("" if len(own) == 1 else f" (median of {len(own)} alternated repeats' ratios, their range in brackets)"),
        head,
        rule,
    ]
    for nbytes in sizes:
        h = hora["median"][nbytes]
        row = (
            f"| {human(nbytes):>7} | {nbytes / memcpy[nbytes] / 1e9:7.2f} | {_cell(h, factor * nbytes / h / 1e9):>16} |"
        )
        for column, runs in repeats.items():
            if column == "hora":
                continue
            result = merged[column]
            if isinstance(result, str):
                row += f" {result[:width]:>{width}} |"
                continue
            t = result["median"][nbytes]
            times = [run["median"][nbytes] for run in runs if not isinstance(run, str)]
            faster = ratio_cell(times, [run["median"][nbytes] for run in own])
            row += f" {_cell(t, factor * nbytes / t / 1e9) + ' ' + faster + 'x':>{width}} |"
        lines.append(row)
    return "\n".join(lines)


def cpu_table(ranks: int, sizes: list[int], results: dict[str, Result]) -> str:
    """Rank 0's CPU time per call against the median time per call (medians of the repeats), up to CPU_TABLE_BYTES."""
    columns = [column for column, result in results.items() if not isinstance(result, str)]
    lines = [
        f"{ranks} ranks on {os.cpu_count()} cores: rank 0's CPU time per call (all its threads) / median time per call",
        "| size | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for nbytes in (n for n in sizes if n <= CPU_TABLE_BYTES):
        cells = []
        for column in columns:
            result = results[column]
            assert not isinstance(result, str)
            cells.append(f"{result['cpu'][nbytes] * 1e6:.1f} / {result['median'][nbytes] * 1e6:.1f} us")
        lines.append(f"| {human(nbytes)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(seconds: float, gbps: float) -> str:
    when = f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"
    return f"{when} {gbps:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="five sizes up to 64 MiB, short runs (under a minute)")
    parser.add_argument("--ranks", default="2,4", help="comma-separated world sizes (default 2,4)")
    parser.add_argument("--repeat", type=int, default=1, help="run every peer this many times, in turn (default 1)")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-separated columns to run (default all: {','.join(PEERS)})"
    )
    parser.add_argument("--worker", choices=["hora", "gloo", "mpi"], help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, [int(s) for s in args.sizes.split(",")], args.quick)
        return
    worlds = [int(r) for r in args.ranks.split(",")]
    columns = ["hora", *(c for c in args.peers.split(",") if c != "hora")]
    unknown = [c for c in columns if c not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown column {unknown[0]!r}; the columns are {', '.join(PEERS)}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    sizes = QUICK_SIZES if args.quick else SIZES
    started = time.monotonic()
    print(
        f"allreduce float32 sum, in place, on one host ({os.cpu_count()} cores); load average before: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    memcpy = memcpy_times(sizes, args.quick)
    for ranks in worlds:
        ways = {column: functools.partial(_run, column, ranks, sizes, args.quick) for column in columns}
        repeats = alternate(ways, args.repeat)
        merged = {column: _merged(runs) for column, runs in repeats.items()}
        print()
        print(table(ranks, sizes, memcpy, repeats, merged))
        print()
        print(cpu_table(ranks, sizes, merged))
    print()
    print(
        f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; took {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
