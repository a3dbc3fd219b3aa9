"""Ray Tune sweeps whose trials are distributed Hora jobs.

``distributed_trainable(fn, num_workers)`` returns a Tune trainable whose
resources are one placement group per trial: a small bundle for the trial
itself and one per worker. The trial starts a :class:`RayExecutor` inside
that group and runs ``fn(config)`` on every worker; what rank 0 passes to
:func:`report` reaches Tune (through a queue the trial drains), so
schedulers such as ASHA see every epoch. Stopping a trial kills its process,
and the workers and the queue, which it owns, die with it.

With ``min_workers``, a trial is elastic: its workers run as an
:class:`~hora.ray.ElasticRayExecutor` inside the trial's placement group, and
``fn`` uses :mod:`hora.elastic` (a state, ``state.commit()``, ``@run``) as
under ``horarun``. A worker that dies (its actor killed, its node lost) is
replaced in the bundle it held, and the others go back to their last commit
and go on, down to ``min_workers`` while the replacement starts; the trial
fails only when the job cannot go on. Report between the two halves of a
commit, so that Tune sees every epoch once: ``state.save()`` (from then on
no reset undoes the epoch), :func:`report`, then ``state.check_host_updates()``
(where the job may re-form; ``state.commit()`` is the two together, and a
report after it would be skipped when it re-forms the job).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hora.ray.elastic import ElasticRayExecutor
from hora.ray.executor import RayExecutor

__all__ = ["distributed_trainable", "report"]

_TRIAL_BUNDLE = {"CPU": 0.01}  # the trial's own process waits and relays; it needs next to nothing
_reporter: Any = None  # on a trial's workers: the queue to the trial
_rank: int | None = None  # this worker's rank when last known (an elastic reset may change it)


def report(metrics: dict[str, Any], checkpoint_dir: str | None = None) -> None:
    """Reports ``metrics`` (and a checkpoint directory) to Tune from rank 0; other ranks' calls do nothing.

    Rank 0 is the one at the time of the call (in an elastic trial, it may change after a reset), or
    the last one known after ``hora.shutdown()``.
    """
    global _rank
    import hora

    if _reporter is None:
        return
    if hora.is_initialized():
        _rank = hora.rank()
    if _rank == 0:
        _reporter.put({"metrics": dict(metrics), "checkpoint_dir": checkpoint_dir}, timeout=60)


def _run_trial_worker(fn: Callable[[dict], Any], config: dict, queue: Any) -> Any:
    global _reporter, _rank
    import hora

    _reporter, _rank = queue, hora.rank() if hora.is_initialized() else None
    try:
        return fn(config)
    finally:
        _reporter, _rank = None, None


def _relay(queue: Any) -> None:
    from ray import tune

    while not queue.empty():
        item = queue.get_nowait()
        checkpoint = None
        if item["checkpoint_dir"] is not None:
            checkpoint = tune.Checkpoint.from_directory(item["checkpoint_dir"])
        tune.report(item["metrics"], checkpoint=checkpoint)


def distributed_trainable(fn: Callable[[dict], Any], num_workers: int, cpus_per_worker: float = 1,
                          use_gpu: bool = False, timeout_s: float = 120.0, *, min_workers: int | None = None,
                          elastic_timeout: float = 600.0) -> Any:  # fmt: skip
    """A Tune trainable that runs ``fn(config)`` on ``num_workers`` Hora ranks per trial.

    Use it as ``tune.Tuner(distributed_trainable(train, 2, cpus_per_worker=0.5), param_space=...)``;
    inside ``fn``, call :func:`hora.ray.tune.report` with each epoch's metrics.

    Args:
        fn: the training function every rank runs with the trial's config.
        num_workers: the ranks of a trial (its placement group holds a bundle for each).
        cpus_per_worker: CPUs each rank reserves.
        use_gpu: reserve a GPU per rank.
        timeout_s: seconds the ranks may take to start and meet.
        min_workers: make the trials elastic (see the module): the fewest ranks a trial may go on with.
        elastic_timeout: in an elastic trial, seconds it may stay below ``min_workers`` or take to re-form.
    """
    import ray
    from ray import tune
    from ray.util.queue import Queue

    if min_workers is not None:  # refused here, not in every trial
        ElasticRayExecutor(min_workers=min_workers, max_workers=num_workers, num_workers=num_workers,
                           cpus_per_worker=cpus_per_worker, elastic_timeout=elastic_timeout)  # fmt: skip
    worker = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}

    def run_fixed(config: dict, queue: Any) -> None:
        executor = RayExecutor(num_workers=num_workers, cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                               timeout_s=timeout_s, use_current_placement_group=True, bundle_offset=1)  # fmt: skip
        try:
            # start() stops its driver service itself if it fails.
            executor.start()
            pending = refs = executor._records_remote(_run_trial_worker, (fn, config, queue))
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
                _relay(queue)
            _relay(queue)
            executor._collect(refs)  # raises with the failing rank's traceback
        finally:
            executor.shutdown()

    def run_elastic(config: dict, queue: Any) -> None:
        executor = ElasticRayExecutor(min_workers=min_workers, max_workers=num_workers, num_workers=num_workers,
                                      cpus_per_worker=cpus_per_worker, use_gpu=use_gpu, timeout_s=timeout_s,
                                      elastic_timeout=elastic_timeout, bundle_offset=1)  # fmt: skip
        failure: list[BaseException] = []

        def job() -> None:
            try:
                executor.run(_run_trial_worker, (fn, config, queue))
            except BaseException as exc:  # raised again in the trial's thread, below
                failure.append(exc)

        # The job runs beside the trial's thread, which alone may talk to Tune: it relays the reports.
        runner = threading.Thread(target=job, name="hora-elastic-trial", daemon=True)
        runner.start()
        try:
            while runner.is_alive():
                runner.join(0.2)
                _relay(queue)
            _relay(queue)
        finally:
            if runner.is_alive():  # the relay failed: stop the job, whose workers and service the trial owns
                executor.cancel()
                runner.join(timeout=30)
        if failure:
            raise failure[0]

    def trainable(config: dict) -> None:
        queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": "DEFAULT"})
        try:
            (run_fixed if min_workers is None else run_elastic)(config, queue)
        finally:
            queue.shutdown()

    trainable.__name__ = getattr(fn, "__name__", "hora_trainable")
    resources = tune.PlacementGroupFactory([_TRIAL_BUNDLE] + [worker] * num_workers)
    return tune.with_resources(trainable, resources)
