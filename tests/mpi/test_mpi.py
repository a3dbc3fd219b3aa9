"""MPI mode: jobs that ``mpiexec`` (the mpich wheel's) starts, with no horarun: every collective, what MPI adds,
hora.torch training, the digits example, and a killed rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from hora.runner.mpi_launch import find_mpiexec

from tests.conftest import ROOT, horarun

pytest.importorskip("mpi4py", reason="needs mpi4py: pip install 'hora[mpi]'")
try:
    MPIEXEC = find_mpiexec()
except ValueError as exc:
    pytest.skip(str(exc), allow_module_level=True)
if "hydra" not in subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True, timeout=30).stdout.lower():
    pytest.skip(
        f"{MPIEXEC} is not MPICH's Hydra (the mpich wheel's), whose flags these tests use", allow_module_level=True
    )


def mpiexec(ranks: int, *arguments: str, timeout: float = 200, **env: str) -> subprocess.CompletedProcess:
    """Runs ``mpiexec -n ranks python arguments...`` from the repository root; no horarun variables leak in."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HORA_", "HOROVOD_"))}
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, *arguments], cwd=ROOT,
                          env={**environ, **env}, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def assert_every_rank_passed(result: subprocess.CompletedProcess, ranks: int, at_least: int) -> None:
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    # mpiexec passes each rank's output on as it comes: one rank's line may run into another's.
    summaries = re.findall(r"rank (\d+): (\d+) of (\d+) cases passed", result.stdout)
    assert sorted(int(r) for r, _, _ in summaries) == list(range(ranks)), result.stdout[-3000:]
    assert all(passed == total and int(total) >= at_least for _, passed, total in summaries), summaries


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 3])
def test_what_mpi_mode_adds(ranks: int) -> None:
    assert_every_rank_passed(mpiexec(ranks, "-m", "tests.mpi.mpi_cases"), ranks, 4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_collective(ranks: int) -> None:
    assert_every_rank_passed(mpiexec(ranks, "-m", "tests.core.collective_cases", timeout=280), ranks, 100)


@pytest.mark.timeout(240)
def test_torch_training() -> None:
    assert_every_rank_passed(mpiexec(2, "-m", "tests.torch.training_cases"), 2, 25)


@pytest.mark.timeout(200)
def test_the_digits_example_reaches_95_percent() -> None:
    result = mpiexec(2, "examples/torch/digits.py", "--epochs", "15", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = re.search(r"test accuracy ([\d.]+) on 450 images", result.stdout)
    assert accuracy is not None and float(accuracy.group(1)) >= 0.95, result.stdout[-2000:]


@pytest.mark.timeout(120)
def test_a_killed_rank_fails_the_others_within_the_timeout() -> None:
    # Hydra would end the survivors itself on seeing rank 1 killed; -disable-auto-cleanup leaves that to Hora.
    started = time.monotonic()
    result = subprocess.run(
        [MPIEXEC, "-disable-auto-cleanup", "-n", "2", sys.executable, "-m", "tests.core.killed_worker", "1"],
        cwd=ROOT, env={**os.environ, "HORA_TIMEOUT": "20"}, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert time.monotonic() - started < 60, result.stdout[-2000:]
    report = re.search(r"rank 0: HoraInternalError after ([\d.]+) s: (.*)", result.stdout)
    assert report is not None, result.stdout[-2000:] + result.stderr[-2000:]
    assert float(report.group(1)) < 20 and "lost its connection to rank 1" in report.group(2), report.group(0)
    assert result.returncode != 0  # mpiexec reports the killed rank


def test_comm_is_refused_in_a_job_horarun_started() -> None:
    script = "import hora\ntry:\n    hora.init(comm=[0])\nexcept ValueError as e:\n    print('refused:', e)"
    result = horarun("-np", "1", sys.executable, "-c", script, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused: hora.init: comm= is for jobs that MPI starts" in result.stdout, result.stdout


@pytest.mark.timeout(240)
def test_horarun_mpi_starts_the_job_with_mpiexec() -> None:
    result = horarun("--mpi", "-np", "2", "--cycle-time-ms", "2", sys.executable, "-m", "tests.mpi.mpi_cases",
                     timeout=220)  # fmt: skip
    assert_every_rank_passed(result, 2, 4)
