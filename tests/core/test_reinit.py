"""hora.init() -> shutdown() -> init() in one process: the next rendezvous round, the same ranks, fresh links."""

from __future__ import annotations

import socket
import sys

import hora
import numpy as np
import pytest
from hora import basics
from hora.driver import DriverService
from hora.exceptions import RendezvousError

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


# What hora.elastic.run does to re-form a job, with a set given to init and one added later.
RESET_SETS = """
import numpy as np, hora
from hora.elastic import retry
given = hora.ProcessSet([0, 1])
hora.init(process_sets=[given])
later = hora.add_process_set([1, 2])
assert (given.process_set_id, later.process_set_id) == (1, 2), (given, later)
retry._reset()
assert (given.process_set_id, later.process_set_id) == (1, None), (given, later)
if given.included():
    assert hora.allreduce(np.array([1.0]), op=hora.Sum, process_set=given).tolist() == [2.0]
try:
    hora.allreduce(np.array([1.0]), process_set=later)
except ValueError as error:
    assert "process_set_id=None) is not registered" in str(error), error
else:
    raise AssertionError("a set added after init outlived the reset")
# One rank's shutdown stops the job (as Horovod's does): rank 2, outside `given`, must not stop it while
# ranks 0 and 1 are still reducing over it.
hora.barrier()
hora.shutdown()
assert given.process_set_id is None
print("sets ok")
"""


@pytest.mark.timeout(120)
def test_a_reset_registers_the_sets_given_to_init_again_and_drops_the_others() -> None:
    result = horarun("-np", "3", "--start-timeout", "20", sys.executable, "-c", RESET_SETS, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("sets ok") == 3, result.stdout


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


def test_rounds_are_counted_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process that outlives its job (a reused Spark Python worker) starts the next job at round 0.
    monkeypatch.setattr(basics, "_rounds_joined", (b"", 0))  # restored after the test
    assert basics._next_round(b"job-a") == 0
    assert basics._next_round(b"job-a") == 0  # asking is not joining
    for number in range(3):
        basics._joined_round(b"job-a", number)
    assert basics._next_round(b"job-a") == 3
    assert basics._next_round(b"job-b") == 0
    basics._joined_round(b"job-b", 0)
    assert (basics._next_round(b"job-b"), basics._next_round(b"job-a")) == (1, 0)


@pytest.mark.timeout(60)
def test_an_init_whose_registration_never_reached_the_driver_does_not_use_up_a_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(basics, "_rounds_joined", (b"", 0))
    secret = bytes(range(32))
    with socket.socket() as unused:  # a port nobody listens on: every connection is refused
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]
    monkeypatch.setenv("HORA_SECRET", secret.hex())
    monkeypatch.setenv("HORA_START_TIMEOUT", "1")
    monkeypatch.setenv("HORA_DRIVER_ADDR", f"127.0.0.1:{dead_port}")
    with pytest.raises(
        RendezvousError, match=f"Could not register with the Hora driver service at 127.0.0.1:{dead_port}"
    ):
        hora.init()
    assert not hora.is_initialized()
    with DriverService(1, secret, start_timeout=20) as service:
        monkeypatch.setenv("HORA_DRIVER_ADDR", f"{service.address[0]}:{service.address[1]}")
        monkeypatch.setenv("HORA_START_TIMEOUT", "20")
        hora.init()  # the retry joins round 0, where its peers would be waiting, not round 1
        try:
            assert service.registered(0) == {0}
            assert service.wait(0)[0].rank == 0
            assert basics._next_round(secret) == 1
        finally:
            hora.shutdown()
