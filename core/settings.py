"""Worker settings, read once from the environment at ``hora.init()``.

Each setting has a ``HORA_*`` variable; where Horovod has a variable with the
same meaning, its ``HOROVOD_*`` name is accepted too (the Hora name wins).
The engine's defaults are those of ``hora._native.EngineOptions``, defined
once, in the compiled core.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hora import _native
from hora._env import flag as _flag
from hora._env import lookup as _lookup
from hora._env import number as _number
from hora.driver.contract import WorkerEnv

__all__ = ["Settings", "interface_address", "one_interface"]

_MIB = 1024 * 1024
_ENGINE = _native.EngineOptions()  # the engine's defaults


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    found = _lookup(environ, name)
    if found is None:
        return default
    key, text = found
    if text.strip().lower() not in choices:
        raise ValueError(f"{key}={text!r} is not one of {', '.join(choices)}.")
    return text.strip().lower()


def _tristate(environ: Mapping[str, str], name: str) -> bool | None:
    """A boolean variable where unset means "decide automatically" (None)."""
    return _flag(environ, name) if _lookup(environ, name) is not None else None


# The parameters the autotuner may change, and the variables that fix them.
_TUNABLE = {
    "fusion_threshold": "FUSION_THRESHOLD",
    "cycle_time": "CYCLE_TIME",
    "cache": "CACHE_CAPACITY",
    "hierarchical_allreduce": "HIERARCHICAL_ALLREDUCE",
}


def one_interface(caller: str, nics: Collection[str] | str | None) -> str | None:
    """The interface Horovod's ``nics`` argument names (a name, or a set of one); None when it names none.

    Hora's ranks talk over one interface (``HORA_NETWORK_INTERFACE``), so a set of several is refused.
    """
    if not nics:
        return None
    if isinstance(nics, str):
        return nics
    if len(nics) != 1:
        raise ValueError(f"{caller}: the ranks talk over one network interface; give nics={{'eth0'}}, got {nics!r}.")
    return next(iter(nics))


def interface_address(name: str) -> str:
    """Returns the IPv4 address of network interface ``name`` (Linux)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        except OSError:
            available = ", ".join(n for _, n in socket.if_nameindex())
            raise ValueError(
                f"Network interface {name!r} not found or has no IPv4 address; available: {available}."
            ) from None
    return socket.inet_ntoa(packed[20:24])


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs to join its job.

    Attributes:
        driver_address: the driver service, or None for a single-process job.
        secret: the job secret (``HORA_SECRET``, hex).
        worker_index: this worker's slot index (``HORA_WORKER_INDEX``).
        hostname: host identity reported at rendezvous (``HORA_HOSTNAME``).
        bind_host: address the peer listener binds: the address of
            ``HORA_NETWORK_INTERFACE`` when it is set, else ``HORA_BIND_ADDR``.
        advertise_host: address peers connect to: the address of
            ``HORA_NETWORK_INTERFACE`` when it is set, else ``HORA_ADVERTISE_ADDR``,
            else the bind host.
        start_timeout: seconds for rendezvous and connection set-up.
        timeout: seconds a collective may go without progress before failing.
        fusion_threshold_bytes: tensor fusion buffer size (``HORA_FUSION_THRESHOLD``,
            bytes; 0 turns fusion off).
        cycle_time_ms: how long a request may wait for others to fuse with
            (``HORA_CYCLE_TIME``, milliseconds).
        cache_capacity: responses kept in the response cache
            (``HORA_CACHE_CAPACITY``; 0 turns the cache off).
        timeline_filename: Chrome-trace file written from the start
            (``HORA_TIMELINE``); ``{rank}`` in it gives every rank its own file,
            otherwise rank 0 writes it.
        timeline_mark_cycles: mark engine cycles in the timeline
            (``HORA_TIMELINE_MARK_CYCLES``).
        stall_warning_seconds: warn about requests some ranks have not
            submitted after this long (``HORA_STALL_CHECK_TIME_SECONDS``; 0, or
            ``HORA_STALL_CHECK_DISABLE=1``, turns the check off).
        transport: ``"auto"`` (shared memory within a host, TCP between
            hosts) or ``"tcp"`` (TCP everywhere); ``HORA_TRANSPORT``.
        shm_single_copy: ranks sharing memory pass large messages by
            reference, the reader copying straight from the writer's memory,
            where the system allows it (``HORA_SHM_SINGLE_COPY``, default on).
        hierarchical_allreduce: reduce within each host, then across hosts
            (``HORA_HIERARCHICAL_ALLREDUCE``); None decides by the placement.
        stall_shutdown_seconds: fail the job after a stall this long
            (``HORA_STALL_SHUTDOWN_TIME_SECONDS``; default ``timeout``, so a
            rank that never submits fails the job like one that stops
            sending; 0 never). The engine alone never stops a stalled job;
            a worker's default is derived from ``timeout`` here.
        autotune: tune the fusion threshold, cycle time, response cache and
            hierarchical allreduce online (``HORA_AUTOTUNE``); those set
            explicitly are left as they are.
        autotune_log: CSV file of the trials, written by rank 0 (``HORA_AUTOTUNE_LOG``).
        autotune_warmup_samples: samples discarded first (``HORA_AUTOTUNE_WARMUP_SAMPLES``).
        autotune_steps_per_sample: training steps per sample (``HORA_AUTOTUNE_STEPS_PER_SAMPLE``).
        autotune_fixed: the tunable parameters set explicitly.
        elastic: the worker belongs to an elastic job (``HORA_ELASTIC``, set
            by ``horarun`` with elastic flags): its rendezvous rounds may
            change membership, and ``state.commit()`` asks for host updates.
        elastic_timeout: seconds an elastic job's rendezvous round may take
            (``HORA_ELASTIC_TIMEOUT``; horarun's ``--elastic-timeout``).
    """

    driver_address: tuple[str, int] | None
    secret: bytes | None
    worker_index: int
    hostname: str
    bind_host: str
    advertise_host: str
    start_timeout: float
    timeout: float
    fusion_threshold_bytes: int = _ENGINE.fusion_threshold_bytes
    cycle_time_ms: float = _ENGINE.cycle_time_ms
    cache_capacity: int = _ENGINE.cache_capacity
    timeline_filename: str | None = None
    timeline_mark_cycles: bool = False
    stall_warning_seconds: float = _ENGINE.stall_warning_seconds
    stall_shutdown_seconds: float = 300.0
    transport: str = "auto"
    shm_single_copy: bool = True
    hierarchical_allreduce: bool | None = None
    autotune: bool = False
    autotune_log: str | None = None
    autotune_warmup_samples: int = _ENGINE.autotune_warmup_samples
    autotune_steps_per_sample: int = _ENGINE.autotune_steps_per_sample
    autotune_fixed: tuple[str, ...] = ()
    elastic: bool = False
    elastic_timeout: float = 600.0

    def engine_options(self, hosts: list[int], shutdown_timeout: float) -> _native.EngineOptions:
        """The options of this worker's engine: these settings, on a job placed on ``hosts``."""
        options = _native.EngineOptions()
        options.fusion_threshold_bytes = self.fusion_threshold_bytes
        options.cycle_time_ms = self.cycle_time_ms
        options.cache_capacity = self.cache_capacity
        options.stall_warning_seconds = self.stall_warning_seconds
        options.stall_shutdown_seconds = self.stall_shutdown_seconds
        options.shutdown_timeout_seconds = shutdown_timeout
        options.hosts = hosts
        options.hierarchical_allreduce = self.hierarchical_allreduce
        options.autotune = self.autotune
        options.autotune_log = self.autotune_log or ""
        options.autotune_warmup_samples = self.autotune_warmup_samples
        options.autotune_steps_per_sample = self.autotune_steps_per_sample
        options.autotune_fixed = list(self.autotune_fixed)
        return options

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads settings from ``environ`` (default ``os.environ``); raises ValueError on bad values."""
        env = os.environ if environ is None else environ
        contract = WorkerEnv.from_env(env)  # what the launcher said: the job's driver, this worker's place
        interface = env.get("HORA_NETWORK_INTERFACE", "")
        if interface:  # the interface the ranks talk over: listen on its address, and give that to the peers
            bind_host = advertise = interface_address(interface)
        else:
            bind_host = contract.bind or "127.0.0.1"
            advertise = contract.advertise or bind_host
        if advertise in ("0.0.0.0", "::"):
            advertise = socket.gethostname()
        timeout = _number(env, "TIMEOUT", 300.0, minimum=0.001)
        return cls(
            driver_address=contract.driver,
            secret=contract.secret,
            worker_index=contract.index,
            hostname=contract.hostname or socket.gethostname(),
            bind_host=bind_host,
            advertise_host=advertise,
            start_timeout=contract.start_timeout,
            timeout=timeout,
            fusion_threshold_bytes=int(_number(env, "FUSION_THRESHOLD", _ENGINE.fusion_threshold_bytes)),
            cycle_time_ms=_number(env, "CYCLE_TIME", _ENGINE.cycle_time_ms),
            cache_capacity=int(_number(env, "CACHE_CAPACITY", _ENGINE.cache_capacity)),
            timeline_filename=(_lookup(env, "TIMELINE") or (None, None))[1],
            timeline_mark_cycles=_flag(env, "TIMELINE_MARK_CYCLES"),
            stall_warning_seconds=0.0
            if _flag(env, "STALL_CHECK_DISABLE")
            else _number(env, "STALL_CHECK_TIME_SECONDS", _ENGINE.stall_warning_seconds),
            stall_shutdown_seconds=_number(env, "STALL_SHUTDOWN_TIME_SECONDS", timeout),
            transport=_choice(env, "TRANSPORT", ("auto", "tcp"), "auto"),
            shm_single_copy=_tristate(env, "SHM_SINGLE_COPY") is not False,
            hierarchical_allreduce=_tristate(env, "HIERARCHICAL_ALLREDUCE"),
            autotune=_flag(env, "AUTOTUNE"),
            autotune_log=(_lookup(env, "AUTOTUNE_LOG") or (None, None))[1],
            autotune_warmup_samples=int(
                _number(env, "AUTOTUNE_WARMUP_SAMPLES", _ENGINE.autotune_warmup_samples, minimum=1)
            ),
            autotune_steps_per_sample=int(
                _number(env, "AUTOTUNE_STEPS_PER_SAMPLE", _ENGINE.autotune_steps_per_sample, minimum=1)
            ),
            autotune_fixed=tuple(name for name, variable in _TUNABLE.items() if _lookup(env, variable) is not None),
            elastic=contract.elastic_timeout is not None,
            elastic_timeout=contract.elastic_timeout or 600.0,
        )
