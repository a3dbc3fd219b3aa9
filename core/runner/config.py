"""Launch configuration: parsed command-line arguments become one frozen LaunchConfig."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hora.runner.hosts import HostSlots, parse_hostfile, parse_hosts, slots_for

__all__ = ["ENGINE_FLAGS", "LaunchConfig", "config_from_args"]

_MIB = 1024 * 1024
_COUNTS = {"autotune_warmup_samples", "autotune_steps_per_sample"}  # engine flags that must be at least 1

# horarun flags that tune the workers' engine: (argparse dest, worker
# variable, how the value is written). Flags mean what they mean to horovodrun.
ENGINE_FLAGS: tuple[tuple[str, str, Callable[[Any], str | None]], ...] = (
    ("fusion_threshold_mb", "HORA_FUSION_THRESHOLD", lambda mb: str(int(mb * _MIB))),
    ("cycle_time_ms", "HORA_CYCLE_TIME", str),
    ("cache_capacity", "HORA_CACHE_CAPACITY", str),
    ("timeline_filename", "HORA_TIMELINE", str),
    ("timeline_mark_cycles", "HORA_TIMELINE_MARK_CYCLES", lambda on: "1" if on else None),
    ("no_stall_check", "HORA_STALL_CHECK_DISABLE", lambda on: "1" if on else None),
    ("stall_check_warning_time_seconds", "HORA_STALL_CHECK_TIME_SECONDS", str),
    ("stall_check_shutdown_time_seconds", "HORA_STALL_SHUTDOWN_TIME_SECONDS", str),
    ("transport", "HORA_TRANSPORT", str),
    ("hierarchical_allreduce", "HORA_HIERARCHICAL_ALLREDUCE", lambda on: "1" if on else "0"),
    ("autotune", "HORA_AUTOTUNE", lambda on: "1" if on else None),
    ("autotune_log_file", "HORA_AUTOTUNE_LOG", str),
    ("autotune_warmup_samples", "HORA_AUTOTUNE_WARMUP_SAMPLES", str),
    ("autotune_steps_per_sample", "HORA_AUTOTUNE_STEPS_PER_SAMPLE", str),
)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything :func:`hora.runner.launch.launch` needs to run a job."""

    num_proc: int
    hosts: tuple[HostSlots, ...]
    command: tuple[str, ...]
    start_timeout: float = 30.0
    verbose: bool = False
    output_filename: str | None = None
    network_interface: str | None = None
    engine_env: tuple[tuple[str, str], ...] = ()
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    env: tuple[tuple[str, str], ...] = ()


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Validates parsed arguments into a LaunchConfig; raises ValueError with the bad value."""
    if args.num_proc is not None and args.num_proc < 1:
        raise ValueError(f"-np must be at least 1, got {args.num_proc}.")
    if args.hosts and args.hostfile:
        raise ValueError("Pass either -H/--hosts or --hostfile, not both.")
    if args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    else:
        hosts = [HostSlots("localhost", args.num_proc or 1)]
    num_proc = args.num_proc or sum(h.slots for h in hosts)
    slots_for(hosts, num_proc)  # raises if the hosts cannot hold num_proc processes
    if not args.command:
        raise ValueError("No command given; usage: horarun -np N python train.py")
    if args.start_timeout <= 0:
        raise ValueError(f"--start-timeout must be positive, got {args.start_timeout}.")
    engine_env = []
    for dest, variable, write in ENGINE_FLAGS:
        given = getattr(args, dest, None)
        least = 1 if dest in _COUNTS else 0
        if isinstance(given, (int, float)) and not isinstance(given, bool) and given < least:
            raise ValueError(f"--{dest.replace('_', '-')} must be >= {least}, got {given}.")
        text = None if given is None else write(given)
        if text is not None:
            engine_env.append((variable, text))
    env = []
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not name:
            raise ValueError(f"Bad --env entry {item!r}; expected NAME=VALUE.")
        env.append((name, value if sep else ""))
    return LaunchConfig(
        num_proc=num_proc,
        hosts=tuple(hosts),
        command=tuple(args.command),
        start_timeout=args.start_timeout,
        verbose=args.verbose,
        output_filename=args.output_filename,
        network_interface=args.network_interface,
        engine_env=tuple(engine_env),
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        env=tuple(env),
    )
