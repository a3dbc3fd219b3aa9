"""``hora.spark.run_elastic``: an elastic job on Spark tasks, as Horovod's ``horovod.spark.run_elastic``.

Unlike :func:`hora.spark.run`'s barrier stage, where one failed task fails
them all, the tasks here form an ordinary stage, which Spark retries task by
task (``spark.task.maxFailures``; a local master retries only as
``local[N, F]`` says). Each task attempt is a worker of an elastic job
(:mod:`hora.driver.elastic`, open membership): it joins by registering, so a
retried task joins the job at the running workers' next commit. When a
task's Python worker dies, its event stream to the driver closes without a
word: the driver drops it from the job, and the others, whose collectives
failed, go back to their last commit and re-form without it (the function
uses :mod:`hora.elastic`: a state, ``@hvd.elastic.run``).

On Spark Connect (no ``sparkContext``) the stage is an ordinary
``mapInPandas`` over one row per task, which Spark retries task by task the
same way.

A function that raises fails its task, which Spark retries as a new worker;
when Spark gives up (``spark.task.maxFailures``), the job fails with the
traceback. Each task attempt's worker index is ``partition + num_proc * attempt``:
unique, and known without asking the driver. Ranks are assigned at each
rendezvous (``hora.rank()``); no rank variable is set before.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import IO, Any

import cloudpickle
from hora._env import number
from hora.driver import ElasticRounds
from hora.driver.contract import WorkerEnv
from hora.driver.job import Job
from hora.exceptions import HoraError, RemovedFromJobError
from hora.spark.barrier import (
    DEFAULT_START_TIMEOUT,
    _master,
    _python_traceback,
    _spark_session,
    cancel_stage,
    connect_stage,
    horovod_options,
    is_connect,
    session_slots,
)
from hora.spark.output import OutputPrinter
from hora.spark.task import task_session

__all__ = ["run_elastic"]


def run_elastic(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    spark: Any = None,
    nics: Collection[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
) -> list[Any]:
    """Runs the elastic training function ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks.

    Hora is initialised in every task before ``fn`` runs (so ``hvd.init()``
    inside it is a no-op). ``fn`` trains with :mod:`hora.elastic`: a task
    whose Python worker dies costs the others their work since the last
    commit, and Spark's retry of it joins them at their next commit.

    Args:
        fn: the function; it and its arguments are cloudpickled to the executors.
        args: positional arguments of ``fn``.
        kwargs: keyword arguments of ``fn``.
        num_proc: the number of tasks (default: every task slot of the cluster).
        min_np: the fewest workers training continues with (default ``num_proc``, as Horovod).
        max_np: the most workers at once (default ``num_proc``).
        start_timeout: seconds for the first rendezvous (default ``HORA_SPARK_START_TIMEOUT``, else 600).
        elastic_timeout: seconds to wait for ``min_np`` workers, or for the job to re-form
            (default ``HORA_ELASTIC_TIMEOUT``, else 600).
        reset_limit: how many times the job may re-form; None: no limit.
        env: environment variables for every task while ``fn`` runs.
        stdout: where the tasks' output lines are printed (default ``sys.stdout``).
        stderr: where the tasks' error lines are printed (default ``sys.stderr``).
        verbose: 0 prints no task output on the driver.
        spark: the SparkSession (default: the active one), classic or Spark Connect.
        nics: as Horovod's: the network interface the ranks talk over (one, as ``HORA_NETWORK_INTERFACE``).
        prefix_output_with_timestamp: as Horovod's: each printed line starts with the time it arrived.
        min_num_proc: Horovod's other name for ``min_np``.
        max_num_proc: Horovod's other name for ``max_np``.

    Returns:
        ``fn``'s results on the workers of the last round, in rank order.

    Raises:
        HoraError: the job could not go on (a round missed its deadline, the
            reset limit, Spark gave up on a task), with the reason.
    """
    for name, value, alias in (("min_np", min_np, min_num_proc), ("max_np", max_np, max_num_proc)):
        if value is not None and alias is not None and value != alias:
            raise ValueError(
                f"hora.spark.run_elastic: {name}={value!r} and Horovod's {name[:3]}_num_proc={alias!r} differ."
            )
    min_np = min_num_proc if min_np is None else min_np
    max_np = max_num_proc if max_np is None else max_np
    env = {**horovod_options("hora.spark.run_elastic", nics), **(env or {})}
    session = _spark_session(spark)
    if num_proc is None:
        num_proc = session_slots(session)
    for name, value in (("num_proc", num_proc), ("min_np", min_np), ("max_np", max_np)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"hora.spark.run_elastic: {name} must be a positive integer, got {value!r}.")
    assert num_proc is not None
    min_np = num_proc if min_np is None else min_np
    max_np = num_proc if max_np is None else max_np
    if not min_np <= num_proc <= max_np:
        raise ValueError(
            f"hora.spark.run_elastic: expected min_np <= num_proc <= max_np, got {min_np}, {num_proc} and {max_np}."
        )
    if start_timeout is None:
        start_timeout = number(os.environ, "SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT)
    if elastic_timeout is None:
        elastic_timeout = number(os.environ, "ELASTIC_TIMEOUT", 600.0)
    for name, value in (("start_timeout", start_timeout), ("elastic_timeout", elastic_timeout)):
        if not value > 0:
            raise ValueError(f"hora.spark.run_elastic: {name} must be positive seconds, got {value!r}.")
    job = _ElasticSparkJob(session, num_proc, OutputPrinter(stdout, stderr, verbose, prefix_output_with_timestamp))
    rounds = ElasticRounds(min_np, start_timeout, elastic_timeout, reset_limit=reset_limit, open_membership=True,
                           max_workers=max_np, first_workers=num_proc)  # fmt: skip
    return job.run(rounds, fn, tuple(args), dict(kwargs or {}), env, start_timeout, elastic_timeout)


class _ElasticSparkJob:
    """One run: the driver service, the stage on a thread, and the watch over both."""

    def __init__(self, session: Any, num_proc: int, printer: OutputPrinter) -> None:
        self._session = session
        self._num_proc = num_proc
        self._printer = printer
        self._connect = is_connect(session)
        self._local = _master(session).startswith("local")
        self._lock = threading.Lock()
        self._done: set[int] = set()  # workers that ended their function (returned, raised or left)
        self._group = f"hora-spark-run-elastic-{uuid.uuid4().hex[:12]}"

    def run(self, rounds: ElasticRounds, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
            env: dict[str, str], start_timeout: float, elastic_timeout: float) -> list[Any]:  # fmt: skip
        payload = cloudpickle.dumps((fn, args, kwargs))  # before the service's socket exists: this may raise
        bind = "127.0.0.1" if self._local else "0.0.0.0"
        advertised = "127.0.0.1" if self._local else self._session.conf.get("spark.driver.host")

        def on_event(message: dict[str, Any]) -> None:
            kind = message.get("type")
            if kind == "done":  # it will not register again: no round waits for it
                with self._lock:
                    self._done.add(int(message["index"]))
                rounds.remove(int(message["index"]))
                if message.get("trained"):  # training ended: a retried task arriving now has nothing to join
                    rounds.finish()
            elif kind == "closed" and message.get("index") is not None:
                index = int(message["index"])
                with self._lock:
                    lost = index not in self._done
                if lost:  # its Python worker died: the others re-form without it
                    rounds.remove(index)
                    self._printer.line(index, "stderr", "hora.spark.run_elastic: this task's worker was lost; the "
                                       "others go on from their last commit.")  # fmt: skip
            else:
                self._printer.handle(message)

        job = Job(self._num_proc, host=bind, start_timeout=start_timeout, elastic_timeout=elastic_timeout,
                  rounds=rounds, on_event=on_event)  # fmt: skip
        service = job.service
        # The job's part of every task's contract; each task adds its index, host and address.
        contract = job.contract(0, driver=(advertised, service.address[1]), bind=bind, with_secret=True)
        task = functools.partial(_task, payload=payload, contract=contract, user_env=env, num_proc=self._num_proc)
        outcome: dict[str, Any] = {}

        def stage() -> None:
            try:
                if self._connect:
                    outcome["records"] = connect_stage(self._session, self._num_proc, task, _RECORD_FIELDS,
                                                       self._group, barrier=False)  # fmt: skip
                    return
                sc = self._session.sparkContext
                sc.setJobGroup(self._group, f"hora.spark.run_elastic of {self._num_proc} tasks", interruptOnCancel=True)
                outcome["records"] = sc.parallelize(range(self._num_proc), self._num_proc).mapPartitions(task).collect()
            except BaseException as exc:
                outcome["error"] = exc

        with service:
            thread = threading.Thread(target=stage, daemon=True, name="hora-spark-elastic-stage")
            thread.start()
            while thread.is_alive():
                thread.join(timeout=0.1)
                if thread.is_alive() and rounds.failure() is not None:
                    cancel_stage(self._session, self._group)
                    thread.join()
        failure = rounds.failure()
        if failure is not None:
            raise HoraError(f"hora.spark.run_elastic: {failure}") from outcome.get("error")
        if "error" in outcome:
            summary = _python_traceback(str(outcome["error"]))
            raise HoraError(f"hora.spark.run_elastic: the Spark job failed:\n{summary}") from outcome["error"]
        records = [r for r in outcome["records"] if not r.get("left")]
        return [cloudpickle.loads(r["value"]) for r in sorted(records, key=lambda r: r["rank"])]


# What a task sends back (on Connect, as a row of these fields).
_RECORD_FIELDS = {"index": "int", "rank": "int", "value": "binary", "left": "boolean"}


def _task(
    partition: Iterator[int], *, payload: bytes, contract: WorkerEnv, user_env: dict[str, str], num_proc: int
) -> Iterator[dict[str, Any]]:
    """Runs on an executor: one task attempt joins the elastic job as a worker, runs the function, yields its record."""
    import hora
    from pyspark import TaskContext

    context = TaskContext.get()
    index = context.partitionId() + num_proc * context.attemptNumber()
    host = socket.gethostname()
    local = contract.bind == "127.0.0.1"
    mine = dataclasses.replace(contract, index=index, place={"HORA_HOSTNAME": host, "HOROVOD_HOSTNAME": host},
                               advertise=None if local else socket.gethostbyname(host))  # fmt: skip
    record: dict[str, Any] = {}
    with task_session(mine, user_env) as session:
        session.events.send({"type": "hello", "index": index})  # the stream is this worker's: its closing says so
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            hora.init()
            value = fn(*args, **kwargs)
            record = {"index": index, "rank": hora.rank(), "value": cloudpickle.dumps(value)}
        except RemovedFromJobError:
            record = {"index": index, "left": True}
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
            record = {"index": index, "left": True}  # hora.elastic.run ends a worker the job goes on without
        except Exception:
            sys.stderr.write(traceback.format_exc())
            raise  # the task fails, and Spark retries it (a new worker), up to spark.task.maxFailures
        finally:
            hora.shutdown()  # before "done": the driver drops it from the rounds once it is gone
            session.events.send({"type": "done", "index": index, "trained": "value" in record})
    yield record
