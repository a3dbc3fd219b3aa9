"""hora.driver.job: one job's secret, driver service, contracts and failure reports, for every launcher."""

from __future__ import annotations

import threading

from hora.driver import register
from hora.driver.contract import WorkerEnv
from hora.driver.job import FailureReport, Job


def test_each_job_draws_its_own_secret_and_its_workers_register_with_it() -> None:
    first, second = Job(2, host="127.0.0.1", start_timeout=10), Job(2, host="127.0.0.1", start_timeout=10)
    assert len(first.secret) == 32 and first.secret != second.secret
    results: list[object] = [None, None]

    def join(index: int) -> None:
        results[index] = register(first.service.address, first.secret, index=index, host="h",
                                  address=("127.0.0.1", 9000 + index), timeout=10)  # fmt: skip

    with first.service, second.service:
        threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=15)
    assert [r.rank for r in results] == [0, 1]  # type: ignore[attr-defined]


def test_the_contract_carries_the_job_and_the_worker() -> None:
    job = Job(3, host="127.0.0.1", start_timeout=12.5, elastic_timeout=40.0)
    try:
        plain = job.contract(2, {"HORA_HOSTNAME": "a"}, bind="127.0.0.1")
        assert plain == WorkerEnv(job.service.address, 2, 12.5, bind="127.0.0.1", place={"HORA_HOSTNAME": "a"},
                                  elastic_timeout=40.0)  # fmt: skip
        assert plain.secret is None  # horarun sends it on the guard's standard input
        given = job.contract(0, driver=("driver.example", 7), with_secret=True).to_env()
        assert given["HORA_DRIVER_ADDR"] == "driver.example:7" and given["HORA_SECRET"] == job.secret.hex()
        assert given["HORA_ELASTIC_TIMEOUT"] == "40.0"
    finally:
        job.service.stop()


def test_the_earliest_failure_is_blamed_whatever_order_the_reports_arrive_in() -> None:
    job = Job(3, host="127.0.0.1", start_timeout=10)
    try:
        assert job.first_failure() is None and job.failures() == []
        late = FailureReport(2, 2, time=105.0, traceback="HoraInternalError: a peer left")
        cause = FailureReport(0, 0, time=100.0, traceback="ValueError: boom")
        exited = FailureReport(1, None, time=103.0, exit_code=3)
        for report in (late, exited, cause):
            job.report(report)
        assert job.first_failure() is cause
        assert job.failures() == [late, exited, cause]  # as they arrived
    finally:
        job.service.stop()
