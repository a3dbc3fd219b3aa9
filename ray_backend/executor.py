"""``RayExecutor``: a group of Hora workers as Ray actors, and functions run on all of them.

``start()`` reserves a placement group (PACK by default), starts one actor
per worker in it and makes them one Hora job: the driver starts the same
rendezvous service as ``horarun`` and Spark, and each actor registers with
its Ray node id as its host identity, so ranks on one node share memory.
Each actor's environment gets ``HORA_RANK`` ... ``HORA_HOSTNAME`` (the node
id) and the ``HOROVOD_*`` names before it joins, computed from the nodes
(see :mod:`hora.runner.rank_env`). The service runs until ``shutdown()``,
so a function may call ``hora.shutdown()`` then ``hora.init()`` and get the
same ranks in the next rendezvous round.
``run`` returns every worker's result in rank order. A function that raises
shuts that worker's Hora down (the others' collectives fail rather than
hang) and ``run`` raises ``HoraError`` with the rank and its traceback; the
executor must then be shut down and started again. Nothing waits forever: a
placement group that cannot be satisfied fails after ``timeout_s`` naming
the resources asked for and available.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hora.driver.job import FailureReport, Job
from hora.exceptions import HoraError
from hora.runner.rank_env import rank_variables
from hora.settings import one_interface

__all__ = ["RayExecutor", "RaySettings", "WorkerState"]


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hora.ray needs ray: pip install 'hora[ray]'.") from exc
    return ray


def _compute(resources: Mapping[str, float]) -> dict[str, float]:
    """The CPU and GPU entries of a Ray resource dict (the rest is memory and node labels)."""
    return {k: v for k, v in resources.items() if k in ("CPU", "GPU")}


@dataclass(frozen=True)
class RaySettings:
    """The settings Horovod's ``RayExecutor`` takes first: make them with :meth:`RayExecutor.create_settings`.

    Attributes:
        timeout_s: seconds for the workers to rendezvous and connect.
        placement_group_timeout_s: seconds for the placement group to be reserved.
        interface: the network interface the ranks talk over (``nics``; None: the default addresses).
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    interface: str | None = None


@dataclass
class WorkerState:
    """What ``execute`` hands to the function on each worker; ``store`` keeps anything between calls."""

    rank: int = -1
    size: int = 0
    local_rank: int = -1
    local_size: int = 0
    store: dict[str, Any] = field(default_factory=dict)


class _Worker:
    """One Hora rank, as a Ray actor (made remote in :meth:`RayExecutor.start`)."""

    def __init__(self) -> None:
        self.state = WorkerState()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def join(self, env: dict[str, str]) -> int:
        import hora

        os.environ.update(env)
        hora.init()
        self.state.rank, self.state.size = hora.rank(), hora.size()
        self.state.local_rank, self.state.local_size = hora.local_rank(), hora.local_size()
        return self.state.rank

    def value(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Runs ``fn`` and returns its value; a failure shuts Hora down here (the others fail, not wait) and raises."""
        import hora

        try:
            return fn(*args, **kwargs)
        except BaseException:
            hora.shutdown()
            raise

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict, with_state: bool) -> dict[str, Any]:
        """Runs ``fn``; a failure is returned (with the time it happened) rather than raised, and ends the job."""
        import hora

        try:
            value = fn(self.state, *args, **kwargs) if with_state else fn(*args, **kwargs)
            return {"ok": True, "value": value}
        except BaseException:
            failure = {"ok": False, "rank": self.state.rank, "time": time.time(), "traceback": traceback.format_exc()}
            hora.shutdown()  # the other ranks' collectives fail instead of waiting for this one
            return failure

    def leave(self) -> None:
        import hora

        hora.shutdown()


class RayExecutor:
    """Runs functions on ``num_workers`` Hora ranks, each a Ray actor.

    As Horovod's: ``RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4)``, or without
    the settings, ``RayExecutor(num_workers=4, timeout_s=60)``.

    Args:
        settings: Horovod's settings (:meth:`create_settings`): the rendezvous and placement group
            timeouts, and the network interface. Not together with ``timeout_s``.
        num_workers: the number of ranks (or give ``num_hosts`` and ``num_workers_per_host``).
        cpus_per_worker: CPUs reserved per worker (fractions allowed).
        use_gpu: reserve GPUs (``gpus_per_worker``, default 1 each).
        gpus_per_worker: GPUs per worker when ``use_gpu``.
        num_hosts: hosts to spread over, with ``num_workers_per_host`` each (STRICT_SPREAD of host bundles).
        num_workers_per_host: workers per host with ``num_hosts``.
        env: environment variables for the workers.
        timeout_s: seconds for the placement group and for the rendezvous (default 60).
        placement_group_strategy: "PACK" (default) or "SPREAD".
        use_current_placement_group: as Horovod, when the caller runs in a placement group (a Tune
            trial's), start the workers there (in any of its bundles, or worker i in bundle
            ``bundle_offset + i``); otherwise reserve a group.
        bundle_offset: see ``use_current_placement_group``; None: any bundle.

    The arguments up to ``use_current_placement_group`` come in Horovod's order; the rest are keywords.
    """

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1, cpus_per_worker: float = 1,
                 use_gpu: bool = False, gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 *, env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                 placement_group_strategy: str = "PACK", bundle_offset: int | None = None) -> None:  # fmt: skip
        if settings is not None and not isinstance(settings, RaySettings):
            raise TypeError(
                f"RayExecutor's first argument is Horovod's settings (RayExecutor.create_settings(...)) or None, "
                f"got {settings!r}; give the number of workers as num_workers=."
            )
        if settings is not None and timeout_s is not None:
            raise ValueError("Give the timeouts in settings (create_settings(timeout_s=...)) or timeout_s=, not both.")
        env = dict(env or {})
        if settings is not None and settings.interface:
            env.setdefault("HORA_NETWORK_INTERFACE", settings.interface)
        for name, value in (("num_hosts", num_hosts), ("num_workers_per_host", num_workers_per_host)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if num_hosts is not None:
            if num_workers is not None:
                raise ValueError("Give num_workers, or num_hosts (with num_workers_per_host), not both.")
            num_workers = num_hosts * num_workers_per_host
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}.")
        if not cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be positive, got {cpus_per_worker!r}.")
        if placement_group_strategy not in ("PACK", "SPREAD"):
            raise ValueError(f"placement_group_strategy must be 'PACK' or 'SPREAD', got {placement_group_strategy!r}.")
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.num_hosts, self.num_workers_per_host = num_hosts, num_workers_per_host
        self.env = env
        # Horovod's settings time the rendezvous and the placement group apart; timeout_s= times both.
        self.timeout_s = settings.timeout_s if settings else 60.0 if timeout_s is None else timeout_s
        self.placement_group_timeout_s = settings.placement_group_timeout_s if settings else self.timeout_s
        self.strategy = placement_group_strategy
        self.use_current_placement_group = use_current_placement_group
        self.bundle_offset = bundle_offset
        self._workers: list[Any] = []  # actors in rank order
        self._job: Job | None = None  # from start() to shutdown(): its secret, service and failure reports
        self._placement_group: Any = None
        self._owns_placement_group = False
        self._failed: str | None = None

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: float = 100,
                        nics: set[str] | None = None) -> RaySettings:  # fmt: skip
        """Horovod's settings of a Ray job: the rendezvous and placement group timeouts, and the interface.

        ``ssh_identity_file`` and ``ssh_str`` are accepted for Horovod's scripts and unused: Hora's actors
        reach each other with no ssh. ``nics`` names at most one interface (``HORA_NETWORK_INTERFACE``).
        """
        del ssh_identity_file, ssh_str  # Ray starts the workers: nothing is reached through ssh
        if not timeout_s > 0 or not placement_group_timeout_s > 0:
            raise ValueError(
                f"create_settings: timeouts must be positive seconds, got timeout_s={timeout_s!r} and "
                f"placement_group_timeout_s={placement_group_timeout_s!r}."
            )
        return RaySettings(float(timeout_s), float(placement_group_timeout_s), one_interface("create_settings", nics))

    # --- life cycle -----------------------------------------------------------------------

    def _bundles(self) -> tuple[list[dict[str, float]], str]:
        one = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}
        if self.num_hosts:
            per_host = {k: v * self.num_workers_per_host for k, v in one.items()}
            return [per_host] * self.num_hosts, "STRICT_SPREAD"
        return [one] * self.num_workers, self.strategy

    def _reserve(self) -> None:
        ray = _ray()
        from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group

        if self.use_current_placement_group:
            self._placement_group = get_current_placement_group()
            if self._placement_group is not None:
                count = self._placement_group.bundle_count
                if self.bundle_offset is not None and self.bundle_offset + self.num_workers > count:
                    raise HoraError(
                        f"RayExecutor: bundle_offset={self.bundle_offset} and {self.num_workers} workers need "
                        f"{self.bundle_offset + self.num_workers} bundles; the current placement group has {count}."
                    )
                return
        bundles, strategy = self._bundles()
        group = placement_group(bundles, strategy=strategy)
        try:
            ray.get(group.ready(), timeout=self.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise HoraError(
                f"RayExecutor: could not reserve {len(bundles)} bundles of {bundles[0]} ({strategy}) within "
                f"{self.placement_group_timeout_s:g} s; the cluster has {_compute(ray.cluster_resources())} in all and "
                f"{_compute(ray.available_resources())} free. Ask for fewer workers or CPUs per worker, or add nodes."
            ) from None
        self._placement_group, self._owns_placement_group = group, True

    def _bundle_index(self, worker: int) -> int:
        if not self._owns_placement_group:  # the caller's
            return -1 if self.bundle_offset is None else self.bundle_offset + worker
        return worker // self.num_workers_per_host if self.num_hosts else worker

    def start(self) -> RayExecutor:
        """Reserves the resources, starts the actors and joins them into one Hora job."""
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._workers or self._job is not None:
            raise HoraError("RayExecutor.start(): already started; call shutdown() first.")
        if not ray.is_initialized():
            ray.init()
        self._reserve()
        actor = ray.remote(_Worker)
        workers: list[Any] = []
        try:
            for i in range(self.num_workers):
                strategy = PlacementGroupSchedulingStrategy(self._placement_group, self._bundle_index(i))
                options = {"num_cpus": self.cpus_per_worker, "num_gpus": self.gpus_per_worker}
                workers.append(actor.options(**options, scheduling_strategy=strategy).remote())
            nodes = ray.get([w.node.remote() for w in workers], timeout=self.timeout_s)
            here = ray.get_runtime_context().get_node_id()
            local = all(node == here for node in nodes)
            bind = "127.0.0.1" if local else "0.0.0.0"
            # The job lives as long as the executor, not just this rendezvous: a function that calls
            # hora.shutdown() then hora.init() joins its next round (see hora.driver.rounds).
            self._job = Job(self.num_workers, host=bind, start_timeout=self.timeout_s)
            self._job.service.start()  # kept first, so that the failure path below closes its socket
            address = "127.0.0.1" if local else ray.util.get_node_ip_address()
            # The nodes are the host identities, so every rank variable is known before rendezvous.
            driver = (address, self._job.service.address[1])
            envs = [
                {**self.env, **self._job.contract(i, place, driver=driver, bind=bind, with_secret=True).to_env()}
                for i, place in enumerate(rank_variables(nodes))
            ]
            ranks = ray.get([w.join.remote(env) for w, env in zip(workers, envs, strict=True)],
                            timeout=self.timeout_s + 10)  # fmt: skip
        except BaseException:
            for w in workers:
                ray.kill(w)
            self._stop_service()
            self._release()
            raise
        self._workers = [w for _, w in sorted(zip(ranks, workers, strict=True), key=lambda pair: pair[0])]
        self._failed = None
        return self

    def shutdown(self) -> None:
        """Stops the workers and releases their resources; the executor can be started again."""
        ray = _ray()
        workers, self._workers = self._workers, []
        if workers and self._failed is None:
            done, _ = ray.wait([w.leave.remote() for w in workers], num_returns=len(workers), timeout=30)
            del done
        for w in workers:
            ray.kill(w)
        self._stop_service()  # after the actors left: none of them can still be joining a round
        self._release()

    def _stop_service(self) -> None:
        """Stops the rendezvous service, if running: no worker of this executor may join a round after this."""
        if self._job is not None:
            self._job.service.stop()
        self._job = None

    def _release(self) -> None:
        if self._placement_group is not None and self._owns_placement_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._placement_group)
        self._placement_group, self._owns_placement_group = None, False

    # --- running --------------------------------------------------------------------------

    def _check(self) -> None:
        if not self._workers:
            raise HoraError("RayExecutor is not started; call start() first.")
        if self._failed is not None:
            raise HoraError(f"RayExecutor failed earlier ({self._failed}); call shutdown() and start() again.")

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any] | None, with_state: bool,
                workers: list[Any]) -> list[Any]:  # fmt: skip
        self._check()
        return [w.call.remote(fn, tuple(args), dict(kwargs or {}), with_state) for w in workers]

    def _collect(self, refs: list[Any]) -> list[Any]:
        ray = _ray()
        try:
            records = ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            dead = self._dead_ranks(refs)
            who = f"rank {dead[0]}" if dead else "a worker"
            self._failed = f"{who} died"
            raise HoraError(
                f"RayExecutor: the actor of {who} died (its process exited or was killed) while running the "
                f"function; the other ranks' collectives fail because of it. Ray says: {exc}"
            ) from exc
        job = self._job
        assert job is not None  # _submit checked that the executor runs
        for record in records:
            if not record["ok"]:
                rank = record["rank"]
                job.report(FailureReport(rank, rank, record["time"], traceback=record["traceback"]))
        first = job.first_failure()  # the others usually failed because of it
        if first is not None:
            self._failed = f"rank {first.rank} raised"
            raise HoraError(f"RayExecutor: rank {first.rank} failed:\n{first.traceback.rstrip()}")
        return [r["value"] for r in records]

    def _dead_ranks(self, refs: list[Any]) -> list[int]:
        """The ranks (positions in ``refs``) whose actor died, as far as Ray knows by now."""
        ray = _ray()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
        dead = []
        for rank, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError:
                    dead.append(rank)
        return dead

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` on every worker; returns the results in rank order."""
        return self._collect(self._submit(fn, args, kwargs, False, self._workers))

    def run_remote(self, fn: Callable[..., Any], args: tuple = (),
                   kwargs: Mapping[str, Any] | None = None) -> list[Any]:  # fmt: skip
        """Starts ``fn(*args, **kwargs)`` on every worker; returns Ray object refs of the results, in rank order.

        As in Horovod, ``ray.get`` on them gives the results; a rank that raised makes it raise Ray's error
        (the other ranks' collectives fail rather than wait), and the executor must be started again.
        """
        self._check()
        return [w.value.remote(fn, tuple(args), dict(kwargs or {})) for w in self._workers]

    def _records_remote(self, fn: Callable[..., Any], args: tuple) -> list[Any]:
        """Starts ``fn`` on every worker; refs of ``{"ok", "value"}`` records, for :meth:`_collect`."""
        return self._submit(fn, args, None, False, self._workers)

    def execute(self, fn: Callable[[WorkerState], Any]) -> list[Any]:
        """Runs ``fn(state)`` on every worker, ``state`` being that worker's :class:`WorkerState`."""
        return self._collect(self._submit(fn, (), None, True, self._workers))

    def execute_single(self, fn: Callable[[WorkerState], Any]) -> Any:
        """Runs ``fn(state)`` on rank 0 only and returns its result."""
        return self._collect(self._submit(fn, (), None, True, self._workers[:1]))[0]

    def __enter__(self) -> RayExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
