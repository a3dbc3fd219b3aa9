"""The ``horarun`` command line. Parsing only; the work is in config and launch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hora.runner.config import config_from_args
from hora.runner.elastic_launch import launch_elastic
from hora.runner.launch import launch
from hora.runner.mpi_launch import launch_with_mpi

__all__ = ["main", "make_parser"]


def make_parser() -> argparse.ArgumentParser:
    """The argument parser; flags mean what they mean to horovodrun."""
    parser = argparse.ArgumentParser(
        prog="horarun",
        description="Run a Hora job: horarun -np 4 python train.py",
    )
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, help="number of processes")
    parser.add_argument("-H", "--hosts", help="host:slots[,host:slots...]; default localhost")
    parser.add_argument(
        "-hostfile", "--hostfile", help="file with one host per line: 'host slots=N', 'host:N' or 'host'"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        help="seconds for all workers to start (default: HORA_START_TIMEOUT or HOROVOD_START_TIMEOUT, else 30)",
    )
    parser.add_argument("--verbose", action="store_true", help="print what the launcher does")
    parser.add_argument("--output-filename", help="directory for per-rank logs: DIR/rank.N/{stdout,stderr}")
    parser.add_argument(
        "-prefix-timestamp",
        "--prefix-output-with-timestamp",
        dest="prefix_output_with_timestamp",
        action="store_true",
        help="start every relayed output line with the time it arrived",
    )
    parser.add_argument(
        "--bind-cores",
        action="store_true",
        help="bind each worker to its local rank's share of its host's cores (HORA_BIND_CORES=1)",
    )
    parser.add_argument(
        "--network-interface",
        "--network-interfaces",
        dest="network_interface",
        help="interface whose address workers use (e.g. eth0)",
    )
    elastic = parser.add_argument_group("elastic (workers come and go; see hora.elastic)")
    elastic.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        help="fewest processes training continues with; below it, wait for more (default: -np)",
    )
    elastic.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=int,
        help="most processes the job grows to (default: every available slot)",
    )
    elastic.add_argument(
        "--host-discovery-script",
        help="executable printing the available hosts, one 'host' or 'host:slots' per line; run about once a second",
    )
    elastic.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=int,
        help="slots of a host the discovery script prints without ':slots' (default 1)",
    )
    elastic.add_argument(
        "--reset-limit", type=int, help="most times the job may re-form (grow, shrink, recover) before it fails"
    )
    elastic.add_argument(
        "--blacklist-cooldown-range",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="seconds a failing host stays blacklisted (doubling each time); default: for good",
    )
    elastic.add_argument("--elastic-timeout", type=float,
                         help="seconds to wait for --min-np workers or for the job to re-form "
                              "(default: HORA_ELASTIC_TIMEOUT, else 600)")  # fmt: skip
    engine = parser.add_argument_group("engine")
    engine.add_argument("--fusion-threshold-mb", type=float, help="tensor fusion buffer size in MiB (0: no fusion)")
    engine.add_argument("--cycle-time-ms", type=float, help="how long requests wait to be fused, in milliseconds")
    engine.add_argument("--cache-capacity", type=int, help="responses kept in the response cache (0: off)")
    engine.add_argument(
        "--autotune",
        action="store_true",
        help="tune fusion threshold, cycle time, cache and hierarchical allreduce online (rank 0 decides)",
    )
    engine.add_argument("--autotune-log-file", help="CSV file of the autotuner's trials, written by rank 0")
    engine.add_argument("--autotune-warmup-samples", type=int, help="samples discarded before tuning (default 3)")
    engine.add_argument("--autotune-steps-per-sample", type=int, help="training steps per sample (default 10)")
    engine.add_argument(
        "--timeline-filename", help="write a Chrome-trace timeline; {rank} in the name gives each rank a file"
    )
    engine.add_argument("--timeline-mark-cycles", action="store_true", help="mark engine cycles in the timeline")
    engine.add_argument("--no-stall-check", action="store_true", help="do not warn about stalled requests")
    engine.add_argument(
        "--stall-check-warning-time-seconds", type=float, help="warn about requests stalled this long (default 60)"
    )
    engine.add_argument(
        "--stall-check-shutdown-time-seconds",
        type=float,
        help="stop the job after a stall this long (default: HORA_TIMEOUT, 300 s; 0: never)",
    )
    engine.add_argument(
        "--transport",
        choices=("auto", "tcp"),
        help="auto: shared memory within a host, TCP between hosts (default); tcp: TCP everywhere",
    )
    hierarchy = engine.add_mutually_exclusive_group()
    hierarchy.add_argument(
        "--hierarchical-allreduce",
        dest="hierarchical_allreduce",
        action="store_const",
        const=True,
        help="allreduce within each host, then across hosts (default: when the placement favours it)",
    )
    hierarchy.add_argument(
        "--no-hierarchical-allreduce",
        dest="hierarchical_allreduce",
        action="store_const",
        const=False,
        help="always run one ring over all ranks",
    )
    controller = parser.add_mutually_exclusive_group()
    controller.add_argument("--mpi", action="store_true", help="start the workers with mpiexec (they meet through MPI)")
    controller.add_argument("--gloo", action="store_true", help="start the workers with Hora's own launcher (default)")
    parser.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, as one string (with --mpi)")
    parser.add_argument("-p", "--ssh-port", type=int, help="ssh port of the remote hosts")
    parser.add_argument("-i", "--ssh-identity-file", help="ssh identity file")
    parser.add_argument(
        "-x",
        "--env",
        action="append",
        metavar="NAME[=VALUE]",
        help="a variable for every worker; NAME alone passes on this environment's value",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each worker runs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``horarun``; returns the job's exit code."""
    args = make_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"horarun: {exc}", file=sys.stderr)
        return 2
    if args.mpi:
        if config.elastic is not None:
            print("horarun: elastic jobs are started by horarun itself; drop --mpi.", file=sys.stderr)
            return 2
        if config.bind_cores:
            print("horarun: with --mpi, mpiexec places the ranks: bind them with its own option in --mpi-args "
                  "(MPICH: '-bind-to core'; Open MPI: '--bind-to core').", file=sys.stderr)  # fmt: skip
            return 2
        if args.ssh_port or args.ssh_identity_file:
            print("horarun: --mpi starts the ranks through mpiexec, which has its own ssh settings; drop -p/-i "
                  "(or pass them in --mpi-args).", file=sys.stderr)  # fmt: skip
            return 2
        try:
            return launch_with_mpi(config, args.mpi_args)
        except ValueError as exc:
            print(f"horarun: {exc}", file=sys.stderr)
            return 2
    if args.mpi_args:
        print("horarun: --mpi-args needs --mpi.", file=sys.stderr)
        return 2
    if config.elastic is not None:
        return launch_elastic(config, config.elastic)
    return launch(config)


if __name__ == "__main__":
    sys.exit(main())
