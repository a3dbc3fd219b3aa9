"""``hora.spark.run``: a function on ``num_proc`` Spark tasks at once, each a Hora rank.

The driver starts the same rendezvous service as ``horarun`` and runs one
barrier stage of ``num_proc`` tasks, so Spark starts them all together or
not at all. Each task points Hora at the service (through ``HORA_*``
variables), registers with its executor's host as its host identity (ranks
on one host share memory), runs the cloudpickled function and sends back
its return value; its output lines stream to the driver as they are written.

Failure handling: a task whose function raises reports its traceback at
once over its event stream and shuts Hora down, which makes the other ranks'
collectives fail instead of hang; if the stage has not ended shortly after
the first failure, the driver cancels the Spark job. A task whose function
calls ``os._exit`` reports its rank and exit code just before it exits;
a Python worker that crashes outright (a signal, a native fault) is named
from Spark's error, ahead of the peers that failed because it was gone. A
task that never registers fails the job after ``start_timeout`` with the
missing ranks named.

On Spark Connect (Databricks serverless and shared clusters: no
``sparkContext``, no RDDs) the stage is a barrier ``mapInPandas`` over one
row per rank, tagged so that it can be interrupted, as TorchDistributor
runs there; everything else is the same.

The barrier stage's task addresses give every task's host before any task
registers, so each task sets ``HORA_RANK`` ... ``HORA_HOSTNAME`` and the
``HOROVOD_*`` names (see :mod:`hora.runner.rank_env`) before Hora starts
and the function runs. Asking for more tasks than the cluster can run at once fails before
anything starts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import IO, Any

import cloudpickle
from hora._env import number
from hora.driver import EventStream
from hora.driver.contract import WorkerEnv
from hora.driver.job import FailureReport, Job
from hora.exceptions import HoraError, RendezvousError
from hora.runner.rank_env import rank_variables
from hora.settings import one_interface
from hora.spark import tracking
from hora.spark.output import LineForwarder, OutputPrinter
from hora.spark.task import task_session
from hora.spark.tracking import MetricsSink

__all__ = ["cancel_stage", "connect_stage", "run"]

DEFAULT_START_TIMEOUT = 600.0  # seconds, as Horovod's HOROVOD_SPARK_START_TIMEOUT
FAILURE_GRACE = 10.0  # seconds the other tasks get to stop by themselves after a failure
# The most seconds os._exit in a task waits for the event stream to report the exit: long enough for another
# thread's send of a line to finish, short enough not to be noticed when the stream is stuck or held by the caller.
EXIT_REPORT_SECONDS = 0.5


def _spark_session(spark: Any) -> Any:
    if spark is not None:
        return spark
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("hora.spark needs pyspark: pip install 'hora[spark]'.") from exc
    active = SparkSession.getActiveSession()
    if active is None:
        raise HoraError(
            "hora.spark.run found no active SparkSession; create one (SparkSession.builder.getOrCreate()) "
            "or pass spark=."
        )
    return active


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect session (no ``sparkContext``: serverless, shared clusters).

    Told by its class's module: importing Connect's session module to compare
    fails (and warns) where Connect's dependencies are not installed.
    """
    return type(session).__module__.startswith("pyspark.sql.connect.")


def task_slots(sc: Any) -> int:
    """How many tasks the cluster can run at once, as Spark's barrier scheduler counts them."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # not a classic JVM-backed context: estimate as Spark's docs do
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        return max(sc.defaultParallelism // cpus, 1)


def session_slots(session: Any) -> int | None:
    """How many tasks ``session``'s cluster can run at once; None where a Connect session cannot tell."""
    if not is_connect(session):
        return task_slots(session.sparkContext)
    cpus = int(session.conf.get("spark.task.cpus", "1") or 1)
    parallelism = session.conf.get("spark.default.parallelism", None)
    if parallelism:
        return max(int(parallelism) // cpus, 1)
    # A local master says: "local", "local[4]", "local[*]", "local[4, 2]" (cores, task retries).
    local = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", session.conf.get("spark.master", "") or "")
    if local is None:
        return None
    cores = local.group(1) or "1"
    return max(((os.cpu_count() or 1) if cores == "*" else int(cores)) // cpus, 1)


def _master(session: Any) -> str:
    if is_connect(session):
        return session.conf.get("spark.master", "") or ""
    return session.sparkContext.master


def horovod_options(
    caller: str, nics: Collection[str] | None, extra_mpi_args: str | None = None, executable: str | None = None
) -> dict[str, str]:
    """The task environment that Horovod's launch options of ``caller`` ask for; options Hora cannot honour fail."""
    if extra_mpi_args:
        raise ValueError(
            f"{caller} starts no MPI, so extra_mpi_args={extra_mpi_args!r} cannot apply; name the network "
            "interface with nics= and engine settings with env= (HORA_* variables)."
        )
    if executable is not None:
        raise ValueError(
            f"{caller} runs the function in Spark's own Python workers, so executable={executable!r} cannot "
            "apply; choose their interpreter with PYSPARK_PYTHON."
        )
    interface = one_interface(caller, nics)
    return {"HORA_NETWORK_INTERFACE": interface} if interface else {}


def run(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    spark: Any = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    mlflow: bool | None = None,
    nics: Collection[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    extra_mpi_args: str | None = None,
    executable: str | None = None,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks, each a Hora rank; returns the results in rank order.

    Hora is initialised in every task before ``fn`` runs (so ``hora.init()``
    or ``hvd.init()`` inside ``fn`` is a no-op) and shut down after it.

    Args:
        fn: the function; it and its arguments are cloudpickled to the executors.
        args: positional arguments of ``fn``.
        kwargs: keyword arguments of ``fn``.
        num_proc: the number of ranks (default: every task slot of the cluster).
        start_timeout: seconds within which every task must start and register
            (default ``HORA_SPARK_START_TIMEOUT``, else 600).
        env: environment variables to set in every task while ``fn`` runs.
        stdout: where the tasks' output lines are printed (default ``sys.stdout``).
        stderr: where the tasks' error lines are printed (default ``sys.stderr``).
        verbose: 0 prints no task output on the driver (it stays in the executor logs).
        spark: the SparkSession, classic or Spark Connect (default: the active one, as in a Databricks
            notebook).
        use_mpi: accepted for Horovod compatibility; Hora needs neither MPI nor Gloo.
        use_gloo: accepted for Horovod compatibility.
        mlflow: where rank 0's :func:`hora.spark.log_metrics` calls go: None (default) logs them to the
            MLflow run active now, if any; True requires one; False logs nothing.
        nics: as Horovod's: the network interface the ranks talk over (one, as ``HORA_NETWORK_INTERFACE``).
        prefix_output_with_timestamp: as Horovod's: each printed line starts with the time it arrived.
        extra_mpi_args: Horovod's; Hora starts no MPI here, so any value is refused.
        executable: Horovod's; ``fn`` runs in Spark's own Python workers (``PYSPARK_PYTHON``), so any value
            is refused.

    Raises:
        HoraError: a task failed (with its rank, traceback and last output lines),
            or the cluster cannot run ``num_proc`` tasks at once.
        RendezvousError: not every task registered within ``start_timeout``.
    """
    del use_mpi, use_gloo
    env = {**horovod_options("hora.spark.run", nics, extra_mpi_args, executable), **(env or {})}
    session = _spark_session(spark)
    slots = session_slots(session)
    if num_proc is None:
        if slots is None:
            raise ValueError(
                "hora.spark.run: this Spark Connect session does not tell how many tasks its cluster runs at once; "
                "pass num_proc=."
            )
        num_proc = slots
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"hora.spark.run: num_proc must be a positive integer, got {num_proc!r}.")
    if slots is not None and num_proc > slots:
        raise HoraError(
            f"hora.spark.run: num_proc={num_proc} but this Spark cluster ({_master(session)}) can run only {slots} "
            f"tasks at once. A barrier stage starts all of its tasks together, so ask for at most {slots} "
            "processes or add executors or cores."
        )
    if start_timeout is None:
        start_timeout = number(os.environ, "SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT, minimum=0.001)
    if not start_timeout > 0:
        raise ValueError(f"hora.spark.run: start_timeout must be positive seconds, got {start_timeout!r}.")
    printer = OutputPrinter(stdout, stderr, verbose, timestamps=prefix_output_with_timestamp)
    sink = MetricsSink.for_active_run(mlflow)
    try:
        return _BarrierJob(session, num_proc, float(start_timeout), env, printer, sink).run(
            fn, tuple(args), dict(kwargs or {})
        )
    finally:
        if sink is not None:
            sink.close()  # what rank 0 sent is in the run when run() returns


class _BarrierJob:
    """One run: the driver service, the barrier stage on a thread, and the watch over both."""

    def __init__(
        self, session: Any, num_proc: int, start_timeout: float, env: dict[str, str], printer: OutputPrinter,
        sink: MetricsSink | None,
    ) -> None:  # fmt: skip
        self._session = session
        self._sink = sink
        self._connect = is_connect(session)
        self._num_proc = num_proc
        self._start_timeout = start_timeout
        self._env = env
        self._printer = printer
        self._local = _master(session).startswith("local")
        self._job: Job  # made by run()
        self._group = f"hora-spark-run-{uuid.uuid4().hex[:12]}"

    def _on_event(self, message: dict[str, Any]) -> None:
        if message.get("type") in ("failed", "exited"):
            exited = message["type"] == "exited"
            self._job.report(FailureReport(int(message["index"]), message.get("rank"), float(message["time"]),
                                           traceback=message.get("traceback", ""),
                                           exit_code=int(message["code"]) if exited else None))  # fmt: skip
        elif message.get("type") == "metrics":
            if self._sink is not None:
                self._sink.handle(message)
        else:
            self._printer.handle(message)

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        payload = cloudpickle.dumps((fn, args, kwargs))  # before the service's socket exists: this may raise
        bind = "127.0.0.1" if self._local else "0.0.0.0"
        advertised = "127.0.0.1" if self._local else self._session.conf.get("spark.driver.host")
        self._job = Job(self._num_proc, host=bind, start_timeout=self._start_timeout, on_event=self._on_event)
        service = self._job.service
        # The job's part of every task's contract; each task adds its index, place and address.
        contract = self._job.contract(0, driver=(advertised, service.address[1]), bind=bind, with_secret=True)
        task = functools.partial(_task, payload=payload, contract=contract, user_env=self._env)
        outcome: dict[str, Any] = {}
        rendezvous: dict[str, BaseException] = {}

        def stage() -> None:
            try:
                outcome["records"] = self._connect_stage(task) if self._connect else self._classic_stage(task)
            except BaseException as exc:
                outcome["error"] = exc

        def watch_rendezvous() -> None:
            try:
                service.wait()
            except RendezvousError as exc:
                rendezvous["error"] = exc

        with service:
            threads = [threading.Thread(target=f, daemon=True, name=f"hora-spark-{f.__name__}")
                       for f in (stage, watch_rendezvous)]  # fmt: skip
            for thread in threads:
                thread.start()
            self._watch(threads[0], rendezvous)
            timed_out = rendezvous.get("error")  # before stop(), which fails a rendezvous still waiting
        if timed_out is not None:
            raise RendezvousError(f"hora.spark.run: {timed_out}") from outcome.get("error")
        failure = self._job.first_failure()
        crash = self._crash_text(outcome["error"]) if "error" in outcome else None
        if crash is not None:  # a task that died without a word: its peers' failures are its consequences
            raise HoraError(crash) from outcome["error"]
        if failure is not None:
            raise HoraError(self._failure_text(failure)) from outcome.get("error")
        if "error" in outcome:
            summary = _python_traceback(str(outcome["error"]))
            raise HoraError(f"hora.spark.run: the Spark job failed:\n{summary}") from outcome["error"]
        records = outcome["records"]
        failed = sorted(r["index"] for r in records if r.get("failed"))
        if failed:  # their reports did not arrive (the event stream broke)
            raise HoraError(f"hora.spark.run: tasks {failed} failed; see their executor logs for the tracebacks.")
        return [cloudpickle.loads(r["value"]) for r in sorted(records, key=lambda r: r["rank"])]

    def _classic_stage(self, task: Callable[..., Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The barrier stage as an RDD's: one partition per rank, in a job group the watch can cancel."""
        sc = self._session.sparkContext
        sc.setJobGroup(self._group, f"hora.spark.run of {self._num_proc} ranks", interruptOnCancel=True)
        return sc.parallelize(range(self._num_proc), self._num_proc).barrier().mapPartitions(task).collect()

    def _connect_stage(self, task: Callable[..., Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        return connect_stage(self._session, self._num_proc, task, _RECORD_FIELDS, self._group, barrier=True)

    def _cancel(self) -> None:
        cancel_stage(self._session, self._group)

    def _watch(self, stage: threading.Thread, rendezvous: dict[str, BaseException]) -> None:
        """Waits for the stage; cancels it when rendezvous failed or a failed task's peers do not stop."""
        first_failure_at = None
        while stage.is_alive():
            stage.join(timeout=0.1)
            failed = bool(self._job.failures())
            if failed and first_failure_at is None:
                first_failure_at = time.monotonic()
            overdue = first_failure_at is not None and time.monotonic() - first_failure_at > FAILURE_GRACE
            if stage.is_alive() and ("error" in rendezvous or overdue):
                self._cancel()
                stage.join()

    def _failure_text(self, failure: FailureReport) -> str:
        who = f"rank {failure.rank}" if failure.rank is not None else f"task {failure.index}"
        tail = "\n".join(self._printer.tail(failure.index))
        if failure.exit_code is not None:
            text = (
                f"hora.spark.run: {who} (task {failure.index}) failed: its Python worker exited with code "
                f"{failure.exit_code} (os._exit), without a Python exception."
            )
        else:
            text = f"hora.spark.run: {who} failed:\n{failure.traceback.rstrip()}"
        return text + (f"\nLast output lines of {who}:\n{tail}" if tail else "")

    def _crash_text(self, error: BaseException) -> str | None:
        """Names the task whose Python worker crashed (a signal, a native fault), from Spark's error, if it says."""
        text = str(error)
        if "Python worker exited unexpectedly" not in text:
            return None
        # Spark names the task as "barrier task ResultTask(<stage>, <partition>)" or "task <partition>.<attempt>".
        match = re.search(r"ResultTask\(\d+, (\d+)\)", text) or re.search(r"task (\d+)\.\d+ in stage", text)
        if match is None:
            return None
        index = int(match.group(1))
        if any(f.index == index for f in self._job.failures()):
            return None  # it did report (an os._exit): that report is more precise
        tail = "\n".join(self._printer.tail(index))
        text = (
            f"hora.spark.run: task {index} failed: its Python worker crashed (killed by a signal or a native fault) "
            "before it could report a Python exception; see its executor log."
        )
        return text + (f"\nLast output lines of task {index}:\n{tail}" if tail else "")


def connect_stage(session: Any, num_tasks: int, task: Callable[..., Iterator[dict[str, Any]]],
                  fields: Mapping[str, str], tag: str, *, barrier: bool) -> list[dict[str, Any]]:  # fmt: skip
    """A stage of ``num_tasks`` tasks on Spark Connect, which has no RDDs: ``mapInPandas`` over one row per task.

    Each task runs ``task`` (as an RDD partition function, on an empty partition) and sends back its
    records as rows of ``fields`` (name: Spark SQL type; a missing field is null, and absent again in
    the records returned). The stage is tagged ``tag``, so ``session.interruptTag(tag)`` stops it (as
    TorchDistributor runs on Connect); ``barrier`` makes it a barrier stage.
    """
    schema = ", ".join(f"{name} {kind}" for name, kind in fields.items())
    flags = {name: bool for name, kind in fields.items() if kind == "boolean"}

    def pandas_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        for _ in batches:  # the one input row says nothing the task context does not
            pass
        records = [{field: record.get(field) for field in fields} for record in task(iter(()))]
        yield pd.DataFrame(records, columns=list(fields)).astype(flags)

    session.addTag(tag)
    try:
        rows = session.range(num_tasks, numPartitions=num_tasks).mapInPandas(pandas_task, schema, barrier=barrier)
        return [{k: v for k, v in row.asDict().items() if v is not None} for row in rows.collect()]
    finally:
        session.removeTag(tag)


def cancel_stage(session: Any, tag: str) -> None:
    """Stops the stage tagged (Spark Connect) or in the job group (classic) ``tag``."""
    if is_connect(session):
        session.interruptTag(tag)
    else:
        session.sparkContext.cancelJobGroup(tag)


def _python_traceback(text: str) -> str:
    """The Python traceback inside a Spark error's text (which also holds pages of JVM stack), or its first line."""
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return text.splitlines()[0] if text else text
    lines = []
    for line in text[start:].splitlines():
        if line.startswith("\tat ") or "SQLSTATE" in line:
            break
        lines.append(line)
    return "\n".join(lines).rstrip()


class _ExitReporter:
    """A task's ``os._exit`` while its function runs: tells the driver who exited and how, then exits.

    ``os._exit`` ends the Python worker with no exception, and Spark reports
    only "crashed": the report is the driver's one chance to name the rank and
    its code. But the exit comes first. Another thread may be in the middle of
    a send (a :class:`LineForwarder`), or ``os._exit`` may be called from a
    signal handler on the very thread that holds the stream's lock, which
    would never be released: the report waits at most
    :data:`EXIT_REPORT_SECONDS` for the stream and is skipped otherwise, and
    whatever goes wrong with it, the process exits.
    """

    def __init__(
        self,
        real_exit: Callable[[int], Any],
        events: EventStream,
        forwarders: tuple[LineForwarder, ...],
        index: int,
        rank: int,
    ) -> None:
        self._real_exit = real_exit
        self._events = events
        self._forwarders = forwarders
        self._index = index
        self.rank = rank  # updated once hora.init() has assigned it

    def __call__(self, code: int) -> None:
        try:
            for forwarder in self._forwarders:
                forwarder.close_line(within=EXIT_REPORT_SECONDS)
            report = {"type": "exited", "index": self._index, "rank": self.rank, "time": time.time(), "code": int(code)}
            self._events.send(report, within=EXIT_REPORT_SECONDS)
            self._events.close(within=EXIT_REPORT_SECONDS)
        finally:
            self._real_exit(code)


# What a task sends back (on Connect, as a row of these fields).
_RECORD_FIELDS = {"index": "int", "rank": "int", "value": "binary", "failed": "boolean"}


def _task(
    _partition: Iterator[int], *, payload: bytes, contract: WorkerEnv, user_env: dict[str, str]
) -> Iterator[dict[str, Any]]:
    """Runs on an executor: joins the job as one rank, runs the function, yields its record."""
    import hora
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    index = context.partitionId()
    hosts = [info.address.rsplit(":", 1)[0] for info in context.getTaskInfos()]
    host = hosts[index]
    # Every task's host is known before rendezvous, so its rank variables are too (see hora.runner.rank_env).
    place = rank_variables(hosts)[index]
    local = contract.bind == "127.0.0.1"
    mine = dataclasses.replace(contract, index=index, place=place, advertise=None if local else host)
    with task_session(mine, user_env) as session:
        rank = int(place["HORA_RANK"])
        real_exit = os._exit
        reporting_exit = _ExitReporter(real_exit, session.events, session.forwarders, index, rank)
        os._exit = reporting_exit
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            hora.init()
            rank = reporting_exit.rank = hora.rank()
            tracking.bind(session.events, rank)
            record = {"index": index, "rank": rank, "value": cloudpickle.dumps(fn(*args, **kwargs))}
        except BaseException:
            text = traceback.format_exc()
            sys.stderr.write(text)
            report = {"type": "failed", "index": index, "rank": rank, "time": time.time(), "traceback": text}
            session.events.send(report)
            record = {"index": index, "rank": rank, "failed": True}
        finally:
            tracking.bind(None, 0)
            os._exit = real_exit
    yield record
