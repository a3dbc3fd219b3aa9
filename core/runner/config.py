"""Launch configuration: parsed command-line arguments become one frozen LaunchConfig."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hora._env import number
from hora.runner.hosts import HostSlots, parse_hostfile, parse_hosts, slots_for

__all__ = ["ENGINE_FLAGS", "ElasticConfig", "LaunchConfig", "config_from_args"]

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
class ElasticConfig:
    """The elastic part of a launch (horovodrun's flags).

    Attributes:
        min_np: the fewest workers training may continue with.
        max_np: the most workers the job grows to; None: as many as there are slots.
        discovery_script: prints the available ``host[:slots]`` lines; None: the fixed hosts.
        slots_per_host: the slots of a host the script prints without ``:slots``.
        reset_limit: how many times the job may re-form; None: no limit.
        cooldown_range: ``(min, max)`` seconds a failing host stays blacklisted; None: for good.
        elastic_timeout: seconds to wait for ``min_np`` workers, and for a round to complete.
    """

    min_np: int
    max_np: int | None = None
    discovery_script: str | None = None
    slots_per_host: int = 1
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    elastic_timeout: float = 600.0


@dataclass(frozen=True)
class LaunchConfig:
    """Everything :func:`hora.runner.launch.launch` needs to run a job."""

    num_proc: int
    hosts: tuple[HostSlots, ...]
    command: tuple[str, ...]
    start_timeout: float = 30.0
    verbose: bool = False
    output_filename: str | None = None
    prefix_output_with_timestamp: bool = False
    network_interface: str | None = None
    engine_env: tuple[tuple[str, str], ...] = ()
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    elastic: ElasticConfig | None = None
    bind_cores: bool = False


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Validates parsed arguments into a LaunchConfig; raises ValueError with the bad value."""
    if args.num_proc is not None and args.num_proc < 1:
        raise ValueError(f"-np must be at least 1, got {args.num_proc}.")
    if args.hosts and args.hostfile:
        raise ValueError("Pass either -H/--hosts or --hostfile, not both.")
    elastic = _elastic_from_args(args)
    if args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    else:
        hosts = [HostSlots("localhost", args.num_proc or (elastic.min_np if elastic else 1))]
    if elastic is not None and elastic.discovery_script:
        if args.hosts or args.hostfile:
            raise ValueError("--host-discovery-script finds the hosts; drop -H/--hostfile.")
        num_proc = args.num_proc or elastic.min_np
    else:
        num_proc = args.num_proc or sum(h.slots for h in hosts)
        slots_for(hosts, num_proc)  # raises if the hosts cannot hold num_proc processes
    if elastic is not None and (elastic.min_np > num_proc or (elastic.max_np or num_proc) < num_proc):
        raise ValueError(
            f"Expected --min-np <= -np <= --max-np, got {elastic.min_np}, {num_proc} and {elastic.max_np}."
        )
    if not args.command:
        raise ValueError("No command given; usage: horarun -np N python train.py")
    start_timeout = args.start_timeout
    if start_timeout is None:  # as horovodrun: the variable, else 30 s
        start_timeout = number(os.environ, "START_TIMEOUT", 30.0, minimum=0.001)
    elif start_timeout <= 0:
        raise ValueError(f"--start-timeout must be positive, got {start_timeout}.")
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
        if not sep:  # as mpirun's -x NAME: this environment's value
            if name not in os.environ:
                raise ValueError(f"-x {name}: {name} is not set in horarun's environment; give -x {name}=VALUE.")
            value = os.environ[name]
        env.append((name, value))
    return LaunchConfig(
        num_proc=num_proc,
        hosts=tuple(hosts),
        command=tuple(args.command),
        start_timeout=start_timeout,
        verbose=args.verbose,
        output_filename=args.output_filename,
        prefix_output_with_timestamp=args.prefix_output_with_timestamp,
        network_interface=args.network_interface,
        engine_env=tuple(engine_env),
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        env=tuple(env),
        elastic=elastic,
        bind_cores=bool(getattr(args, "bind_cores", False)),
    )


def _elastic_from_args(args: argparse.Namespace) -> ElasticConfig | None:
    """The elastic part of the arguments: an elastic job is one with a discovery script, --min-np or --max-np."""
    script = getattr(args, "host_discovery_script", None)
    min_np, max_np = getattr(args, "min_np", None), getattr(args, "max_np", None)
    if script is None and min_np is None and max_np is None:
        return None
    for flag, value in (("--min-np", min_np), ("--max-np", max_np), ("--slots-per-host", args.slots_per_host)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}.")
    if args.reset_limit is not None and args.reset_limit < 0:
        raise ValueError(f"--reset-limit must be >= 0, got {args.reset_limit}.")
    cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
    if cooldown is not None and not 1 <= cooldown[0] <= cooldown[1] <= 3600:
        raise ValueError(
            f"--blacklist-cooldown-range {cooldown[0]} {cooldown[1]}: expected 1 <= MIN <= MAX <= 3600 seconds."
        )
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = number(os.environ, "ELASTIC_TIMEOUT", 600.0)
    if not timeout > 0:
        raise ValueError(f"--elastic-timeout must be positive, got {timeout}.")
    return ElasticConfig(
        min_np=min_np or args.num_proc or 1,
        max_np=max_np,
        discovery_script=script,
        slots_per_host=args.slots_per_host or 1,
        reset_limit=args.reset_limit,
        cooldown_range=cooldown,  # type: ignore[arg-type]
        elastic_timeout=timeout,
    )
