"""Rank 0's metrics in the driver's MLflow run, while ``hora.spark.run`` goes on.

Inside a task, :func:`log_metrics` sends rank 0's metrics to the driver over
the job's authenticated event stream (the other ranks' calls do nothing);
the driver logs them to the MLflow run that was active when ``run`` began,
so the executors need no tracking credentials and a notebook's run fills in
epoch by epoch. Nothing is logged when MLflow is not installed or no run is
active (``mlflow=None``, the default); ``mlflow=False`` never logs.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

from hora.exceptions import HoraError

__all__ = ["MetricsSink", "log_metrics"]

# The task's event stream and rank while its function runs (a Python worker runs one task at a time).
_task_stream: tuple[Any, int] | None = None


def bind(stream: Any, rank: int) -> None:
    """Called by the task around the user's function: where :func:`log_metrics` sends (None: nowhere)."""
    global _task_stream
    _task_stream = None if stream is None else (stream, rank)


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Logs ``metrics`` (name -> number) at ``step`` to the driver's MLflow run; only rank 0's calls count.

    Call it from the function ``hora.spark.run`` runs. Metrics are sent to
    the driver, which logs them to the MLflow run that was active when
    ``run`` began (if any), as they arrive.

    Raises:
        HoraError: called outside a ``hora.spark.run`` task.
        ValueError: a name is not a string, a value not a number, or ``step`` not an integer.
    """
    bound = _task_stream
    if bound is None:
        raise HoraError("hora.spark.log_metrics works inside the function that hora.spark.run runs.")
    stream, rank = bound
    checked = _checked(metrics, step)
    if rank == 0:
        stream.send({"type": "metrics", "metrics": checked, "step": step})


def _checked(metrics: Any, step: Any) -> dict[str, float]:
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"hora.spark.log_metrics: step must be an integer or None, got {step!r}.")
    if not isinstance(metrics, Mapping):
        raise ValueError(f"hora.spark.log_metrics: metrics must be a mapping of name to number, got {metrics!r}.")
    checked = {}
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise ValueError(f"hora.spark.log_metrics: metric names are strings, got {name!r}.")
        try:
            checked[name] = float(value)  # NaN and infinities too: MLflow records a diverging loss as it is
        except (TypeError, ValueError):
            raise ValueError(f"hora.spark.log_metrics: {name!r} is {value!r}, not a number.") from None
    return checked


class MetricsSink:
    """The driver's end: the MLflow run active when the job began, logged to on a thread of its own.

    MLflow's active run is per thread, so the run is captured by id and
    logged to through an ``MlflowClient``. Events are queued (at most
    ``QUEUE_LIMIT`` waiting; past that they are dropped, with one warning)
    so a slow tracking server never holds up rank 0's event stream, and
    :meth:`close` logs what is queued before the job returns.
    """

    QUEUE_LIMIT = 10_000
    CLOSE_SECONDS = 60.0

    def __init__(self, run_id: str) -> None:
        from mlflow import MlflowClient

        self.run_id = run_id
        self._client = MlflowClient()
        self._queue: queue.Queue[tuple[dict[str, float], int] | None] = queue.Queue(self.QUEUE_LIMIT)
        self._warned = False
        self._thread = threading.Thread(target=self._log, name="hora-mlflow-metrics", daemon=True)
        self._thread.start()

    @classmethod
    def for_active_run(cls, mode: bool | None) -> MetricsSink | None:
        """A sink for the active MLflow run; None when ``mode`` is False, or None and there is no run.

        Raises:
            HoraError: ``mode`` is True but MLflow is not installed or no run is active.
        """
        if mode is False:
            return None
        try:
            import mlflow
        except ImportError:
            if mode:
                raise HoraError("mlflow=True, but MLflow is not installed: pip install 'hora[mlflow]'.") from None
            return None
        run = mlflow.active_run()
        if run is None:
            if mode:
                raise HoraError("mlflow=True, but no MLflow run is active: call mlflow.start_run() first.")
            return None
        return cls(run.info.run_id)

    def handle(self, message: Mapping[str, Any]) -> None:
        """Queues one ``metrics`` event (checked by the sender; checked again, as it crossed a wire)."""
        try:
            metrics = _checked(message.get("metrics"), message.get("step"))
        except ValueError:
            return
        try:
            self._queue.put_nowait((metrics, message.get("step") or 0))
        except queue.Full:
            self._warn(f"more than {self.QUEUE_LIMIT} metric events are waiting; dropping the newest")

    def close(self) -> None:
        """Logs what is queued (waiting at most ``CLOSE_SECONDS``) and stops the thread."""
        self._queue.put(None)
        self._thread.join(self.CLOSE_SECONDS)

    def _log(self) -> None:
        from mlflow.entities import Metric

        while (item := self._queue.get()) is not None:
            metrics, step = item
            now = int(time.time() * 1000)
            try:
                self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])
            except Exception as exc:  # the tracking server's trouble must not fail the job
                self._warn(f"could not log rank 0's metrics: {exc}")

    def _warn(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"hora.spark: MLflow run {self.run_id}: {text}", stacklevel=2)
