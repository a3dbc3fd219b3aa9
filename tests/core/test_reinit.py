"""hora.init() -> shutdown() -> init() in one process: the next rendezvous round, the same ranks, fresh links."""

from __future__ import annotations

import sys

import hora
import numpy as np
import pytest
from hora import basics

from tests.conftest import horarun

# Three rounds: each checks its rank against the first round's and reduces values that depend on the round.
REINIT = """
import numpy as np, hora
first = None
for round_number in range(3):
    hora.init()
    rank, size = hora.rank(), hora.size()
    first = (rank, size, hora.local_rank()) if first is None else first
    assert (rank, size, hora.local_rank()) == first, ((rank, size, hora.local_rank()), first)
    total = hora.allreduce(np.array([rank + 1.0, 10.0 * round_number]), op=hora.Sum)
    expected = [size * (size + 1) / 2, 10.0 * round_number * size]
    assert total.tolist() == expected, (total.tolist(), expected)
    gathered = hora.allgather(np.array([rank * 100 + round_number], dtype=np.int64))
    assert gathered.tolist() == [r * 100 + round_number for r in range(size)], gathered.tolist()
    hora.shutdown()
    assert not hora.is_initialized()
print("rounds ok", first[0], first[1])
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_proc", [2, 3])
def test_reinit_under_horarun_keeps_ranks_and_reduces_correctly(num_proc: int) -> None:
    result = horarun("-np", str(num_proc), "--start-timeout", "20", sys.executable, "-c", REINIT, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for rank in range(num_proc):
        assert f"[{rank}]<stdout>:rounds ok {rank} {num_proc}" in lines, result.stdout


def test_reinit_alone_stays_a_job_of_one() -> None:
    for round_number in range(2):
        hora.init()
        assert (hora.rank(), hora.size()) == (0, 1)
        assert hora.allreduce(np.array([round_number + 1.0]), op=hora.Sum).tolist() == [round_number + 1.0]
        hora.shutdown()


def test_rounds_are_counted_per_job() -> None:
    # A process that outlives its job (a reused Spark Python worker) starts the next job at round 0.
    assert [basics._next_round(b"job-a"), basics._next_round(b"job-a"), basics._next_round(b"job-a")] == [0, 1, 2]
    assert [basics._next_round(b"job-b"), basics._next_round(b"job-b")] == [0, 1]
