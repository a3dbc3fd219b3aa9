"""The job contract: what every launcher tells a worker so that ``hora.init()`` can join the job.

horarun, the Spark backend and the Ray backend start workers in their own
ways (a process under a guard, a Spark task, a Ray actor) but tell each the
same things, as ``HORA_*`` environment variables: where the driver service
listens, the worker's index, its host identity and expected place, where it
listens for peers, the timeouts, whether the job is elastic, and the job
secret (which horarun delivers on the guard's standard input instead). This
module is the one place those variables are named: launchers build a
:class:`WorkerEnv` and call :meth:`~WorkerEnv.to_env`; the worker's
:class:`~hora.settings.Settings` reads them back with :meth:`~WorkerEnv.from_env`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hora._env import flag, number

__all__ = ["WorkerEnv"]


@dataclass(frozen=True)
class WorkerEnv:
    """One worker's part of the job contract.

    Attributes:
        driver: ``(host, port)`` of the job's driver service (``HORA_DRIVER_ADDR``);
            None for a process no launcher started.
        index: the worker's index in the job, unique (``HORA_WORKER_INDEX``).
        start_timeout: seconds for rendezvous and connection set-up (``HORA_START_TIMEOUT``).
        secret: the job secret (``HORA_SECRET``, hex); None when the launcher
            delivers it another way (horarun: on the guard's standard input).
        bind: the address the worker's peer listener binds (``HORA_BIND_ADDR``).
        advertise: the address peers connect to, if not the bind address (``HORA_ADVERTISE_ADDR``).
        place: the worker's host identity and expected rank variables
            (``HORA_HOSTNAME``, ``HORA_RANK`` ... and the ``HOROVOD_*`` names,
            see :func:`hora.runner.rank_env.rank_variables`); a launcher that
            cannot know the ranks before rendezvous gives the host alone.
        elastic_timeout: set for a worker of an elastic job (``HORA_ELASTIC``,
            ``HORA_ELASTIC_TIMEOUT``): the seconds a rendezvous round may take.
    """

    driver: tuple[str, int] | None
    index: int = 0
    start_timeout: float = 30.0
    secret: bytes | None = None
    bind: str | None = None
    advertise: str | None = None
    place: Mapping[str, str] = field(default_factory=dict)
    elastic_timeout: float | None = None

    def to_env(self) -> dict[str, str]:
        """The variables, as strings (only those set)."""
        env = {"HORA_WORKER_INDEX": str(self.index), "HORA_START_TIMEOUT": str(self.start_timeout)}
        if self.driver is not None:
            env["HORA_DRIVER_ADDR"] = f"{self.driver[0]}:{self.driver[1]}"
        if self.secret is not None:
            env["HORA_SECRET"] = self.secret.hex()
        if self.bind is not None:
            env["HORA_BIND_ADDR"] = self.bind
        if self.advertise is not None:
            env["HORA_ADVERTISE_ADDR"] = self.advertise
        env.update(self.place)
        if self.elastic_timeout is not None:
            env.update(HORA_ELASTIC="1", HORA_ELASTIC_TIMEOUT=str(self.elastic_timeout))
        return env

    @property
    def hostname(self) -> str | None:
        """The worker's host identity (``HORA_HOSTNAME``), if the launcher gave one."""
        return self.place.get("HORA_HOSTNAME") or self.place.get("HOROVOD_HOSTNAME") or None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv:
        """Reads the contract back; ``driver`` is None in a process no launcher started (no ``HORA_DRIVER_ADDR``).

        Raises:
            ValueError: a variable is malformed (quoted), or the driver is given without the secret.
        """
        driver = None
        driver_text = env.get("HORA_DRIVER_ADDR", "")
        if driver_text:
            host, _, port = driver_text.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"HORA_DRIVER_ADDR={driver_text!r} is not of the form host:port.")
            driver = (host, int(port))
        secret_text = env.get("HORA_SECRET", "")
        try:
            secret = bytes.fromhex(secret_text) if secret_text else None
        except ValueError:
            raise ValueError("HORA_SECRET is not a hex string; it must be set by the launcher.") from None
        if driver is not None and not secret:
            raise ValueError("HORA_DRIVER_ADDR is set but HORA_SECRET is not; both come from the launcher.")
        index_text = env.get("HORA_WORKER_INDEX", "0")
        if not index_text.isdigit():
            raise ValueError(f"HORA_WORKER_INDEX={index_text!r} is not a non-negative integer.")
        elastic = flag(env, "ELASTIC")
        return cls(
            driver=driver,
            index=int(index_text),
            start_timeout=number(env, "START_TIMEOUT", 30.0, minimum=0.001),
            secret=secret,
            bind=env.get("HORA_BIND_ADDR") or None,
            advertise=env.get("HORA_ADVERTISE_ADDR") or None,
            place={name: value for name, value in env.items() if name in _PLACE and value},
            elastic_timeout=number(env, "ELASTIC_TIMEOUT", 600.0, minimum=0.001) if elastic else None,
        )


_PLACE = frozenset(
    f"{prefix}_{name}"
    for prefix in ("HORA", "HOROVOD")
    for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
)
