"""hora.spark.run on a real local Spark (local[2]): results, failures, log streaming, limits."""

from __future__ import annotations

import io
import time

import hora
import hora.spark
import numpy as np
import pytest
from hora.exceptions import HoraError, RendezvousError

pytestmark = pytest.mark.timeout(180)


def _allreduce_rank(offset: int) -> list[float]:
    return hora.allreduce(np.array([hora.rank() + offset], dtype=np.float64), op=hora.Sum).tolist()


def test_results_come_back_in_rank_order_with_a_real_allreduce(spark) -> None:
    def fn(offset: int, scale: int = 1) -> tuple[int, int, list[float]]:
        return hora.rank(), hora.size() * scale, _allreduce_rank(offset)

    results = hora.spark.run(fn, args=(10,), kwargs={"scale": 3}, num_proc=2, spark=spark, verbose=0)
    assert results == [(0, 6, [21.0]), (1, 6, [21.0])]


def test_default_num_proc_uses_every_task_slot_and_the_active_session(spark) -> None:
    assert hora.spark.run(lambda: (hora.size(), hora.local_size()), verbose=0) == [(2, 2), (2, 2)]


def test_ranks_on_one_host_share_memory(spark) -> None:
    links = hora.spark.run(lambda: hora.basics.current_job().transport_links(), num_proc=2, verbose=0)
    assert links == [["self", "shm"], ["shm", "self"]]


def test_a_raising_rank_surfaces_its_traceback_and_stops_the_others(spark) -> None:
    def fn() -> None:
        if hora.rank() == 1:
            print("about to fail")
            raise ValueError("boom on purpose")
        time.sleep(0.5)
        hora.allreduce(np.ones(1))  # rank 1 never joins: this must fail, not hang
        hora.allreduce(np.ones(1))

    started = time.monotonic()
    with pytest.raises(HoraError) as info:
        hora.spark.run(fn, num_proc=2, spark=spark, stdout=io.StringIO(), stderr=io.StringIO())
    text = str(info.value)
    assert text.startswith("hora.spark.run: rank 1 failed:"), text
    assert "ValueError: boom on purpose" in text and "in fn" in text
    assert "[1]<stdout>:about to fail" in text  # the rank's last output lines
    assert time.monotonic() - started < 60


def test_too_many_processes_fails_fast_naming_the_slots(spark) -> None:
    started = time.monotonic()
    with pytest.raises(HoraError, match=r"num_proc=3 but this Spark cluster \(local\[2\]\) can run only 2 tasks"):
        hora.spark.run(lambda: None, num_proc=3, spark=spark)
    assert time.monotonic() - started < 5


def test_log_lines_reach_the_driver_as_they_happen(spark) -> None:
    out, err = io.StringIO(), io.StringIO()

    def fn() -> None:
        import sys

        print(f"line one from {hora.rank()}")
        print("partial ", end="")
        print("line")
        print(f"warning from {hora.rank()}", file=sys.stderr)

    hora.spark.run(fn, num_proc=2, spark=spark, stdout=out, stderr=err)
    lines = out.getvalue().splitlines()
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:line one from {rank}" in lines
        assert f"[{rank}]<stdout>:partial line" in lines
        assert f"[{rank}]<stderr>:warning from {rank}" in err.getvalue().splitlines()


def test_horovods_nics_and_timestamped_output(spark) -> None:
    import os
    import re

    def fn() -> str | None:
        print(f"hello from {hora.rank()}")
        return os.environ.get("HORA_NETWORK_INTERFACE")

    out = io.StringIO()
    assert hora.spark.run(fn, num_proc=2, spark=spark, stdout=out, nics={"lo"}, prefix_output_with_timestamp=True) == [
        "lo",
        "lo",
    ]
    for rank in (0, 1):  # Horovod's format: time.asctime(), then the rank prefix
        pattern = rf"\w{{3}} \w{{3}} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\[{rank}\]<stdout>:hello from {rank}"
        assert any(re.fullmatch(pattern, line) for line in out.getvalue().splitlines()), out.getvalue()


def test_horovods_options_that_cannot_apply_are_refused(spark) -> None:
    for options, message in (
        ({"extra_mpi_args": "-mca btl tcp"}, r"starts no MPI, so extra_mpi_args='-mca btl tcp' cannot apply"),
        ({"executable": "/usr/bin/python3"}, r"executable='/usr/bin/python3' cannot apply; .* PYSPARK_PYTHON"),
        ({"nics": {"eth0", "eth1"}}, r"one network interface; give nics=\{'eth0'\}, got"),
    ):
        with pytest.raises(ValueError, match=message):
            hora.spark.run(lambda: None, num_proc=1, spark=spark, **options)


def test_env_is_set_while_fn_runs(spark) -> None:
    import os

    assert hora.spark.run(lambda: os.environ.get("MY_SETTING"), num_proc=2, env={"MY_SETTING": "x"}, verbose=0) == [
        "x",
        "x",
    ]
    assert hora.spark.run(lambda: os.environ.get("MY_SETTING"), num_proc=1, verbose=0) == [None]


class _SlowOnTask1:
    """Unpickles slowly on task 1: that task starts (and registers) long after task 0."""

    def __reduce__(self):
        return (_slow_on_task_1, ())


def _slow_on_task_1() -> None:
    from pyspark import TaskContext

    if TaskContext.get().partitionId() == 1:
        time.sleep(8)


def test_a_task_that_never_registers_fails_the_job_naming_it(spark) -> None:
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"1 of 2 workers registered after 3 s; missing ranks 1"):
        hora.spark.run(lambda _: None, args=(_SlowOnTask1(),), num_proc=2, start_timeout=3, spark=spark, verbose=0)
    assert time.monotonic() - started < 30


def test_bad_arguments_say_what_was_expected(spark) -> None:
    with pytest.raises(ValueError, match=r"num_proc must be a positive integer, got 0"):
        hora.spark.run(lambda: None, num_proc=0, spark=spark)
    with pytest.raises(ValueError, match=r"start_timeout must be positive seconds, got -1"):
        hora.spark.run(lambda: None, num_proc=1, start_timeout=-1, spark=spark)


def _places_before_and_after_init() -> tuple[dict[str, str], list[int]]:
    import os

    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
    before = {f"{p}_{n}": os.environ.get(f"{p}_{n}", "") for p in ("HORA", "HOROVOD") for n in names}
    after = [hora.rank(), hora.size(), hora.local_rank(), hora.local_size(), hora.cross_rank(), hora.cross_size()]
    return before, after


def test_rank_variables_are_set_before_the_function_runs(spark) -> None:
    import os

    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
    results = hora.spark.run(_places_before_and_after_init, num_proc=2, spark=spark, verbose=0)
    assert [after for _, after in results] == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]]
    for before, after in results:
        for prefix in ("HORA", "HOROVOD"):
            assert [int(before[f"{prefix}_{n}"]) for n in names] == after
            assert before[f"{prefix}_HOSTNAME"] == "127.0.0.1"
    assert "HORA_RANK" not in os.environ  # the driver's own environment is untouched


def test_a_rank_that_calls_os_exit_is_named_with_its_exit_code(spark) -> None:
    def fn() -> None:
        import os

        if hora.rank() == 1:
            print("exiting now")
            os._exit(3)
        time.sleep(0.5)
        hora.allreduce(np.ones(1))  # rank 1 is gone: this fails too, but later

    started = time.monotonic()
    with pytest.raises(HoraError) as info:
        hora.spark.run(fn, num_proc=2, spark=spark, stdout=io.StringIO(), stderr=io.StringIO())
    text = str(info.value)
    assert text.startswith("hora.spark.run: rank 1 (task 1) failed: its Python worker exited with code 3"), text
    assert "[1]<stdout>:exiting now" in text
    assert time.monotonic() - started < 60


class _ExitOnTask1:
    """Ends task 1's Python worker with code 0 while the function is unpickled: before it could register."""

    def __reduce__(self):
        return (_exit_on_task_1, ())


def _exit_on_task_1() -> None:
    import os

    from pyspark import TaskContext

    if TaskContext.get().partitionId() == 1:
        os._exit(0)


def test_a_task_that_exits_before_registering_fails_fast_with_its_code(spark) -> None:
    started = time.monotonic()
    with pytest.raises(HoraError, match=r"rank 1 \(task 1\) failed: its Python worker exited with code 0"):
        hora.spark.run(lambda _: None, args=(_ExitOnTask1(),), num_proc=2, start_timeout=60, spark=spark, verbose=0)
    assert time.monotonic() - started < 30  # not the start timeout


def _reinit_on_spark(offset: int) -> list[tuple[int, int, list[float]]]:
    seen = []
    for round_number in range(2):
        if round_number:
            hora.shutdown()
            hora.init()
        total = hora.allreduce(np.array([hora.rank() + offset + round_number], dtype=np.float64), op=hora.Sum)
        seen.append((hora.rank(), hora.size(), total.tolist()))
    return seen


@pytest.mark.timeout(180)
def test_reinit_under_spark_run_keeps_ranks(spark) -> None:
    for offset in (10, 20):  # twice: the reused Python workers start the second job at round 0
        results = hora.spark.run(_reinit_on_spark, args=(offset,), num_proc=2, spark=spark, verbose=0)
        assert results == [[(rank, 2, [2.0 * offset + 1]), (rank, 2, [2.0 * offset + 3])] for rank in range(2)], results
