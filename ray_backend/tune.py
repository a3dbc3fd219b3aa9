"""Ray Tune sweeps whose trials are distributed Hora jobs.

``distributed_trainable(fn, num_workers)`` returns a Tune trainable whose
resources are one placement group per trial: a small bundle for the trial
itself and one per worker. The trial starts a :class:`RayExecutor` inside
that group and runs ``fn(config)`` on every worker; what rank 0 passes to
:func:`report` reaches Tune (through a queue the trial drains), so
schedulers such as ASHA see every epoch. Stopping a trial kills its process,
and the workers and the queue, which it owns, die with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hora.ray.executor import RayExecutor

__all__ = ["distributed_trainable", "report"]

_TRIAL_BUNDLE = {"CPU": 0.01}  # the trial's own process waits and relays; it needs next to nothing
_reporter: Any = None  # on rank 0 of a trial: the queue to the trial


def report(metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
    """Reports ``metrics`` (and a checkpoint directory) to Tune from rank 0; other ranks' calls do nothing."""
    if _reporter is not None:
        _reporter.put({"metrics": dict(metrics), "checkpoint_dir": checkpoint_dir}, timeout=60)


def _run_trial_worker(fn: Callable[[dict], Any], config: dict, queue: Any) -> Any:
    global _reporter
    import hora

    _reporter = queue if hora.rank() == 0 else None
    try:
        return fn(config)
    finally:
        _reporter = None


def _relay(queue: Any) -> None:
    from ray import tune

    while not queue.empty():
        item = queue.get_nowait()
        checkpoint = None
        if item["checkpoint_dir"] is not None:
            checkpoint = tune.Checkpoint.from_directory(item["checkpoint_dir"])
        tune.report(item["metrics"], checkpoint=checkpoint)


def distributed_trainable(fn: Callable[[dict], Any], num_workers: int, cpus_per_worker: float = 1,
                          use_gpu: bool = False, timeout_s: float = 120.0) -> Any:  # fmt: skip
    """A Tune trainable that runs ``fn(config)`` on ``num_workers`` Hora ranks per trial.

    Use it as ``tune.Tuner(distributed_trainable(train, 2, cpus_per_worker=0.5), param_space=...)``;
    inside ``fn``, call :func:`hora.ray.tune.report` with each epoch's metrics.
    """
    import ray
    from ray import tune
    from ray.util.queue import Queue

    worker = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}

    def trainable(config: dict) -> None:
        queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": "DEFAULT"})
        executor = RayExecutor(num_workers=num_workers, cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                               timeout_s=timeout_s, use_current_placement_group=True, bundle_offset=1)  # fmt: skip
        try:
            # start() stops its driver service itself if it fails; the queue is released below either way.
            executor.start()
            pending = refs = executor._records_remote(_run_trial_worker, (fn, config, queue))
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
                _relay(queue)
            _relay(queue)
            executor._collect(refs)  # raises with the failing rank's traceback
        finally:
            executor.shutdown()
            queue.shutdown()

    trainable.__name__ = getattr(fn, "__name__", "hora_trainable")
    resources = tune.PlacementGroupFactory([_TRIAL_BUNDLE] + [worker] * num_workers)
    return tune.with_resources(trainable, resources)
