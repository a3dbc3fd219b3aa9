"""``ElasticRayExecutor``: an elastic Hora job whose workers are Ray actors, as Horovod's.

The job (see :mod:`hora.runner.elastic_job`) discovers the cluster's alive
nodes about once a second; a node offers as many slots as it has CPUs (GPUs
with ``use_gpu``) per worker, and the job keeps a worker on every slot up to
``max_workers``. A worker is an actor pinned to its node that runs the
training function; the function uses :mod:`hora.elastic` (``hvd.init()``,
a state, ``@hvd.elastic.run``) exactly as under ``horarun``. When an actor
dies (its process killed, its node gone), the others go back to their last
commit and re-form without it, and a new actor takes the freed slot where
resources allow (unlike horarun, the node is not blacklisted: a Ray node runs
many actors); a worker whose function raises fails the job (it would fail again). Nodes that join
the cluster are used at the next commit.

Run from inside a placement group (a Tune trial's, see
:func:`hora.ray.tune.distributed_trainable`), the workers take its bundles
instead of the cluster's nodes: a node offers the bundles placed on it, and a
dead worker's bundle goes to its replacement, so an elastic trial never holds
more than Tune gave it.

``run`` returns the function's results from the workers of the last round, in
rank order, or raises :class:`~hora.HoraError` saying why the job could not
go on (too few workers for longer than ``elastic_timeout``, more than
``reset_limit`` resets, a worker failing while the job finished).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hora.elastic import lost_peer
from hora.exceptions import HoraError
from hora.runner.elastic_job import ElasticJob
from hora.settings import one_interface

__all__ = ["ElasticRayExecutor", "ElasticRaySettings"]

_log = logging.getLogger("hora.ray")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hora.ray needs ray: pip install 'hora[ray]'.") from exc
    return ray


class _ElasticWorker:
    """One worker of an elastic job, as a Ray actor (made remote in :meth:`ElasticRayExecutor.run`)."""

    def run(self, env: dict[str, str], fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
        import hora

        os.environ.update(env)
        try:
            value = fn(*args, **kwargs)
            return {"ok": True, "value": value, "rank": hora.rank() if hora.is_initialized() else -1}
        except SystemExit as exc:  # hora.elastic.run ends a worker the job goes on without with exit code 0
            if exc.code in (0, None):
                return {"ok": True, "left": True}
            return {"ok": False, "traceback": traceback.format_exc(), "lost_peer": False}
        except BaseException as exc:
            return {"ok": False, "traceback": traceback.format_exc(), "lost_peer": lost_peer(exc)}
        finally:
            hora.shutdown()


class _GroupSlots:
    """The bundles of a placement group, from ``offset`` on, as an elastic job's slots: one worker per bundle."""

    def __init__(self, group: Any, offset: int) -> None:
        self.group, self.offset = group, offset
        self._held: dict[int, _ActorHandle] = {}  # bundle -> the last worker started in it

    def _placed(self) -> dict[int, str]:
        table = _ray().util.placement_group_table(self.group)
        return {int(b): node for b, node in table["bundles_to_node_id"].items() if int(b) >= self.offset and node}

    def discover(self) -> dict[str, int]:
        """The nodes the group's bundles are on, and how many of them each holds."""
        slots: dict[str, int] = {}
        for node in self._placed().values():
            slots[node] = slots.get(node, 0) + 1
        return slots

    def take(self, node: str) -> int:
        """A bundle on ``node`` that no running worker holds (its last worker, if any, has ended or died).

        The job starts no more workers on a node than it has bundles, and in a placement group that never
        changes, so one is free; a worker whose call ended may still hold its bundle's resources as an idle
        actor, so it is killed first.
        """
        for bundle, where in sorted(self._placed().items()):
            held = self._held.get(bundle)
            if where == node and (held is None or held.poll() is not None):
                if held is not None:
                    held.stop()
                return bundle
        raise HoraError(f"ElasticRayExecutor: no free bundle of the placement group on node {node}; "
                        f"bundles held: {sorted(self._held)}.")  # fmt: skip

    def hold(self, bundle: int, handle: _ActorHandle) -> None:
        self._held[bundle] = handle


class _ActorHandle:
    """An elastic job's view of one actor and its running call (a :class:`~hora.runner.elastic_job.WorkerHandle`)."""

    def __init__(self, actor: Any, call: Any) -> None:
        self.actor = actor
        self.call = call
        self.record: dict[str, Any] | None = None
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            ray = _ray()
            ready, _ = ray.wait([self.call], timeout=0)
            if ready:
                try:
                    self.record = ray.get(self.call)
                    self._code = 0 if self.record["ok"] else 1
                except ray.exceptions.RayActorError:  # its process was killed, or its node is gone
                    self._code = -9
                except Exception as exc:  # Ray could not give the result back (unpicklable, lost, out of memory)
                    self.record = {"ok": False, "traceback": f"{type(exc).__name__}: {exc}", "lost_peer": False}
                    self._code = 1
        return self._code

    def stop(self) -> None:
        _ray().kill(self.actor)

    def last_lines(self) -> str:
        if self.record is not None and not self.record["ok"]:
            return self.record["traceback"].rstrip()
        return "(the actor died)" if self._code == -9 else "(no output)"

    @property
    def lost_peer(self) -> bool:
        """Whether its function failed only because a peer was lost (then it is not to blame)."""
        return self.record is not None and bool(self.record.get("lost_peer"))


@dataclass(frozen=True)
class ElasticRaySettings:
    """The settings Horovod's ``ElasticRayExecutor`` takes first: make them with
    :meth:`ElasticRayExecutor.create_settings`. The fields are the executor's arguments of the same meaning.
    """

    min_np: int = 1
    max_np: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600.0
    timeout_s: float = 30.0
    interface: str | None = None


def _one_of(name: str, value: Any, horovods: str, alias: Any, default: Any) -> Any:
    """An argument given under its name or Horovod's (not both), else ``default``."""
    if value is not None and alias is not None:
        raise ValueError(f"Give {name} or Horovod's {horovods}, not both; got {name}={value!r}, {horovods}={alias!r}.")
    return value if value is not None else alias if alias is not None else default


class ElasticRayExecutor:
    """Runs an elastic training function on Ray actors, as many as the cluster's slots, within bounds.

    As Horovod's: ``ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=2), cpus_per_slot=1)``,
    or without the settings, ``ElasticRayExecutor(min_workers=2, cpus_per_worker=1)``.

    Args:
        settings: Horovod's settings (:meth:`create_settings`): they give ``min_workers``,
            ``max_workers``, ``reset_limit``, ``elastic_timeout``, ``timeout_s`` and the interface,
            which are then not given apart.
        min_workers: the fewest workers training may continue with (default 1).
        max_workers: the most workers; None: one per slot.
        num_workers: workers needed before training starts (default ``min_workers``).
        cpus_per_worker: CPUs each worker reserves (a node's slots: its CPUs / this).
        use_gpu: reserve GPUs, and count a node's slots by its GPUs.
        gpus_per_worker: GPUs per worker with ``use_gpu`` (default 1).
        env: environment variables for the workers.
        reset_limit: how many times the job may re-form; None: no limit.
        elastic_timeout: seconds to wait for ``min_workers``, or for the job to re-form.
        timeout_s: seconds the first rendezvous may take (default 60).
        cpus_per_slot: Horovod's name for ``cpus_per_worker``.
        gpus_per_slot: Horovod's name for ``gpus_per_worker``.
        env_vars: Horovod's name for ``env``.
        override_discovery: Horovod's; the executor always discovers the Ray cluster's nodes itself.
        use_current_placement_group: when :meth:`run` is called inside a placement group (a Tune
            trial's), the workers take its bundles from ``bundle_offset`` on, one each, instead of
            the cluster's nodes (``max_workers`` then defaults to the number of those bundles).
        bundle_offset: the first bundle of the current placement group the workers may take.
    """

    def __init__(self, settings: ElasticRaySettings | None = None, *, min_workers: int | None = None,
                 max_workers: int | None = None, num_workers: int | None = None, cpus_per_worker: float | None = None,
                 use_gpu: bool = False, gpus_per_worker: float | None = None, env: Mapping[str, str] | None = None,
                 reset_limit: int | None = None, elastic_timeout: float | None = None, timeout_s: float | None = None,
                 cpus_per_slot: float | None = None, gpus_per_slot: float | None = None,
                 env_vars: Mapping[str, str] | None = None, override_discovery: bool = True,
                 use_current_placement_group: bool = True, bundle_offset: int = 0) -> None:  # fmt: skip
        if settings is not None and not isinstance(settings, ElasticRaySettings):
            raise TypeError(
                f"ElasticRayExecutor's first argument is Horovod's settings (ElasticRayExecutor.create_settings(...)) "
                f"or None, got {settings!r}; give the bounds as min_workers= and max_workers=."
            )
        if not override_discovery:
            raise ValueError("ElasticRayExecutor discovers the Ray cluster's nodes itself: override_discovery=False "
                             "is not supported.")  # fmt: skip
        given = {"min_workers": min_workers, "max_workers": max_workers, "reset_limit": reset_limit,
                 "elastic_timeout": elastic_timeout, "timeout_s": timeout_s}  # fmt: skip
        if settings is not None:
            both = [name for name, value in given.items() if value is not None]
            if both:
                raise ValueError(f"Give {', '.join(both)} in the settings or as arguments, not both.")
            min_workers, max_workers, reset_limit = settings.min_np, settings.max_np, settings.reset_limit
            elastic_timeout, timeout_s = settings.elastic_timeout, settings.timeout_s
        cpus_per_worker = _one_of("cpus_per_worker", cpus_per_worker, "cpus_per_slot", cpus_per_slot, 1)
        gpus_per_worker = _one_of("gpus_per_worker", gpus_per_worker, "gpus_per_slot", gpus_per_slot, None)
        env = dict(_one_of("env", env, "env_vars", env_vars, None) or {})
        if settings is not None and settings.interface:
            env.setdefault("HORA_NETWORK_INTERFACE", settings.interface)
        min_workers = 1 if min_workers is None else min_workers
        elastic_timeout = 600.0 if elastic_timeout is None else elastic_timeout
        timeout_s = 60.0 if timeout_s is None else timeout_s
        num_workers = min_workers if num_workers is None else num_workers
        for name, value in (("min_workers", min_workers), ("num_workers", num_workers), ("max_workers", max_workers)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not min_workers <= num_workers <= (max_workers or num_workers):
            raise ValueError(
                f"Expected min_workers <= num_workers <= max_workers, got {min_workers}, {num_workers} and "
                f"{max_workers}."
            )
        if not cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be positive, got {cpus_per_worker!r}.")
        for name, seconds in (("elastic_timeout", elastic_timeout), ("timeout_s", timeout_s)):
            if not seconds > 0:
                raise ValueError(f"{name} must be positive seconds, got {seconds!r}.")
        if isinstance(bundle_offset, bool) or not isinstance(bundle_offset, int) or bundle_offset < 0:
            raise ValueError(f"bundle_offset must be a bundle index (an integer >= 0), got {bundle_offset!r}.")
        self.min_workers, self.max_workers, self.num_workers = min_workers, max_workers, num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.env = env
        self.reset_limit = reset_limit
        self.elastic_timeout = elastic_timeout
        self.timeout_s = timeout_s
        self.use_current_placement_group = use_current_placement_group
        self.bundle_offset = bundle_offset
        self._cancelled = threading.Event()
        self._job: ElasticJob | None = None  # while run() runs

    @classmethod
    def create_settings(cls, min_np: int = 1, max_np: int | None = None, reset_limit: int | None = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        nics: set[str] | None = None, min_num_proc: int | None = None,
                        max_num_proc: int | None = None, verbose: int | bool = 0) -> ElasticRaySettings:  # fmt: skip
        """Horovod's settings of an elastic Ray job: the bounds on the workers, the reset limit and timeouts.

        ``min_num_proc``/``max_num_proc`` are Horovod's other names for ``min_np``/``max_np``;
        ``ssh_identity_file`` and ``verbose`` are accepted for Horovod's scripts and unused (Ray needs
        no ssh; the job reports on the ``hora.ray`` logger). ``nics`` names at most one interface.
        """
        del ssh_identity_file, verbose
        min_np = min_np if min_num_proc is None else min_num_proc
        max_np = max_np if max_num_proc is None else max_num_proc
        return ElasticRaySettings(min_np, max_np, reset_limit, float(elastic_timeout), float(timeout_s),
                                  one_interface("create_settings", nics))  # fmt: skip

    def start(self) -> ElasticRayExecutor:
        """Connects to Ray (``ray.init()`` unless already); the workers start with each :meth:`run`."""
        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        return self

    def shutdown(self) -> None:
        """Nothing to release between runs: each :meth:`run` stops its actors before it returns."""

    def cancel(self) -> None:
        """Stops a :meth:`run` running in another thread: its workers are stopped and it raises HoraError."""
        self._cancelled.set()
        job = self._job
        if job is not None:
            job.cancel()

    def discover(self) -> dict[str, int]:
        """The alive nodes (by node id) and the workers each can hold (by its CPUs, and GPUs with ``use_gpu``)."""
        slots = {}
        for node in _ray().nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            count = int(resources.get("CPU", 0) // self.cpus_per_worker)
            if self.gpus_per_worker:  # as many as both its CPUs and its GPUs allow
                count = min(count, int(resources.get("GPU", 0) // self.gpus_per_worker))
            if count:
                slots[node["NodeID"]] = count
        return slots

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """Runs ``fn(*args, **kwargs)`` as an elastic job; returns the results of the last round's workers by rank.

        Raises:
            HoraError: the job could not go on (the reason is in the message).
        """
        ray = _ray()
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        self.start()
        self._cancelled.clear()
        group = get_current_placement_group() if self.use_current_placement_group else None
        bundles = _GroupSlots(group, self.bundle_offset) if group is not None else None
        discover = bundles.discover if bundles is not None else self.discover
        if bundles is not None and not discover():
            raise HoraError(f"ElasticRayExecutor: the current placement group has no bundle from bundle_offset="
                            f"{self.bundle_offset} on ({group.bundle_count} bundles).")  # fmt: skip
        here = ray.get_runtime_context().get_node_id()
        local = set(discover()) <= {here}
        job = ElasticJob(
            discover,
            num_workers=self.num_workers,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            start_timeout=self.timeout_s,
            elastic_timeout=self.elastic_timeout,
            reset_limit=self.reset_limit,
            host="127.0.0.1" if local else "0.0.0.0",
            report=lambda text: _log.warning("ElasticRayExecutor: %s", text),
            blacklist_failures=False,
        )
        actor_class = ray.remote(_ElasticWorker)
        address = "127.0.0.1" if local else ray.util.get_node_ip_address()

        def start(index: int, node: str, place: dict[str, str]) -> _ActorHandle:
            if bundles is None:
                strategy: Any = NodeAffinitySchedulingStrategy(node, soft=False)
            else:
                bundle = bundles.take(node)
                strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
            actor = actor_class.options(num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                                        scheduling_strategy=strategy).remote()  # fmt: skip
            contract = job.contract(index, place, driver=(address, job.service.address[1]),
                                    bind="127.0.0.1" if local else "0.0.0.0", with_secret=True)  # fmt: skip
            env = {**self.env, **contract.to_env()}
            handle = _ActorHandle(actor, actor.run.remote(env, fn, tuple(args), dict(kwargs or {})))
            if bundles is not None:
                bundles.hold(bundle, handle)
            return handle

        self._job = job
        if self._cancelled.is_set():  # cancel() came before the job existed
            job.cancel()
        try:
            job.wait_for_slots()
            with job.service:
                outcome = job.run(start)
        except (TimeoutError, OSError) as exc:
            raise HoraError(f"ElasticRayExecutor: {exc}") from exc
        finally:
            self._job = None
            job.service.stop()  # already stopped, unless waiting for slots failed before it started
            for handle in job.handles():
                handle.stop()
        if outcome.message is not None:
            lines = f"\n{outcome.culprit.last_lines()}" if outcome.culprit is not None else ""
            raise HoraError(f"ElasticRayExecutor: {outcome.message}{lines}")
        records = [job.handle(index).record for index in outcome.finished]  # type: ignore[attr-defined]
        records = [r for r in records if r is not None and not r.get("left")]
        return [r["value"] for r in sorted(records, key=lambda r: r["rank"])]
