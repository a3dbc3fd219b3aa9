"""A job, whatever starts its workers: its secret, its driver service, each worker's contract, its failures.

horarun (a process under a guard, local or over ssh), ``hora.spark.run`` and
``run_elastic`` (Spark tasks), ``RayExecutor`` and ``ElasticRayExecutor``
(Ray actors) start workers in their own ways; what a job is does not change
with them, and lives here: a fresh secret, the driver service that workers
register with (and, for an elastic job, its rounds), the part of the
contract (:class:`~hora.driver.contract.WorkerEnv`) each worker is given,
and the failures workers report themselves (a Spark task's, a Ray actor's),
of which the earliest is to blame (the others usually failed because of
it). A launcher supplies how to start a worker and what its end means
(horarun judges its processes' exit codes and signals itself);
:class:`hora.runner.elastic_job.ElasticJob` adds the elastic supervision
(discovery, blacklists, replacements).

    job = Job(num_workers, host="127.0.0.1", start_timeout=60)
    with job.service:
        for index, place in enumerate(places):
            start_worker(job.contract(index, place, with_secret=True).to_env())
        ...
        first = job.first_failure()
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hora.driver.contract import WorkerEnv
from hora.driver.elastic import ElasticRounds
from hora.driver.service import DriverService

__all__ = ["FailureReport", "Job"]


@dataclass(frozen=True)
class FailureReport:
    """A worker's failure, as its launcher learned of it.

    Attributes:
        index: the worker's index in the job.
        rank: its rank, where known.
        time: when it failed (``time.time()`` where it ran).
        traceback: the Python traceback, when its function raised.
        exit_code: the code it exited with, when it exited without a Python exception (``os._exit``).
    """

    index: int
    rank: int | None
    time: float
    traceback: str = ""
    exit_code: int | None = None


class Job:
    """One job's secret, driver service, contracts and failure reports.

    Args:
        num_workers: the workers of round 0.
        host: the address the driver service listens on.
        start_timeout: seconds a worker may take to start and register (the rendezvous timeout).
        elastic_timeout: for an elastic job: the seconds a later round may take (in every contract).
        rounds: for an elastic job: its rendezvous rounds, which the service keeps.
        expected_hosts: the host each worker index registers from, where the launcher knows it.
        on_event: called with each event a worker sends (output lines, reports).
    """

    def __init__(
        self,
        num_workers: int,
        *,
        host: str,
        start_timeout: float,
        elastic_timeout: float | None = None,
        rounds: ElasticRounds | None = None,
        expected_hosts: Mapping[int, str] | None = None,
        on_event: Callable[[dict], None] | None = None,
    ) -> None:
        self.secret = secrets.token_bytes(32)
        self.start_timeout = start_timeout
        self.elastic_timeout = elastic_timeout
        self.service = DriverService(num_workers, self.secret, host=host, start_timeout=start_timeout,
                                     expected_hosts=expected_hosts, on_event=on_event, elastic=rounds)  # fmt: skip
        self._lock = threading.Lock()
        self._failures: list[FailureReport] = []

    def contract(
        self,
        index: int,
        place: Mapping[str, str] | None = None,
        *,
        driver: tuple[str, int] | None = None,
        bind: str | None = None,
        advertise: str | None = None,
        with_secret: bool = False,
    ) -> WorkerEnv:
        """Worker ``index``'s part of the job contract.

        Args:
            index: the worker's index.
            place: its host identity and expected rank variables, where known.
            driver: where the worker reaches the driver service (default: the address it listens on).
            bind: the address its peer listener binds.
            advertise: the address peers connect to, if not ``bind``.
            with_secret: put the secret in it (for a launcher with no private channel for it; horarun
                sends it on the guard's standard input instead).
        """
        return WorkerEnv(
            driver or self.service.address,
            index,
            self.start_timeout,
            secret=self.secret if with_secret else None,
            bind=bind,
            advertise=advertise,
            place=dict(place or {}),
            elastic_timeout=self.elastic_timeout,
        )

    def report(self, failure: FailureReport) -> None:
        """Records a worker's failure (from any thread)."""
        with self._lock:
            self._failures.append(failure)

    def failures(self) -> list[FailureReport]:
        """The failures reported so far, in the order they arrived."""
        with self._lock:
            return list(self._failures)

    def first_failure(self) -> FailureReport | None:
        """The earliest failure reported, to be blamed: the others are usually its consequences."""
        with self._lock:
            return min(self._failures, key=lambda f: f.time) if self._failures else None
