"""horarun names the worker that caused a failure, and no worker outlives the launcher."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, horarun
from tests.runner.processes import assert_gone, kill_all, wait_for_pids


def _pid_line(path: Path) -> str:
    return f"open('{path}', 'a').write(f'{{os.getpid()}}\\n')"


def _sigkill_launcher_and_expect_gone(script: str, num_proc: int, pids: Path, started: int, within: float) -> None:
    """Runs ``script`` on ``num_proc`` workers, SIGKILLs horarun once ``started`` pids are written to ``pids``,
    and asserts that every one of them is gone ``within`` seconds: only the guard's closed stdin tells the workers."""
    proc = subprocess.Popen([sys.executable, "-m", "hora.runner", "-np", str(num_proc), sys.executable, "-c", script],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    seen: list[int] = []
    try:
        seen = wait_for_pids(pids, started)
        assert len(seen) == started
        proc.kill()  # no chance to clean up
        proc.wait(timeout=10)
        assert_gone(seen, within=within)
    finally:
        proc.kill()
        kill_all(seen)


@pytest.mark.timeout(60)
def test_sigkill_of_the_launcher_stops_local_workers(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    _sigkill_launcher_and_expect_gone(f"import os, time\n{_pid_line(pids)}\ntime.sleep(60)\n", 2, pids, 2, 5.0)


@pytest.mark.timeout(60)
def test_sigkill_of_the_launcher_stops_what_workers_started_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    # A worker's child in its process group that ignores SIGTERM (a DataLoader worker, a child of `sh -c`)
    # outlives the worker's own exit; the guard's SIGKILL to the group after its grace stops it.
    pids = tmp_path / "pids"
    stubborn = (
        f"import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n{_pid_line(pids)}\ntime.sleep(60)\n"
    )
    script = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {stubborn!r}])\n"
        f"{_pid_line(pids)}\n"
        "time.sleep(60)\n"
    )
    # The guard's grace is 3 s; the rest is slack for a loaded machine.
    _sigkill_launcher_and_expect_gone(script, 1, pids, 2, 15.0)


@pytest.mark.timeout(90)
def test_a_stopped_rank_is_named_not_the_rank_that_timed_out_waiting(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = (
        "import os, signal, numpy as np, hora\n"
        "hora.init()\n"
        f"{_pid_line(pids)}\n"
        "if hora.rank() == 1:\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "hora.allreduce(np.ones(4))\n"
    )
    try:
        result = horarun("-np", "3", "-x", "HORA_TIMEOUT=3", sys.executable, "-c", script, timeout=60)
    finally:
        kill_all(wait_for_pids(pids, 3, timeout=0))
    assert result.returncode == 1, result.stderr
    assert "horarun: rank 1 is stopped (its process " in result.stderr, result.stderr
    assert "is in state T: it got SIGSTOP or SIGTSTP), so its peers could not go on" in result.stderr
    assert "was the first to fail: it exited with code 1." in result.stderr


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_is_named_with_the_signal() -> None:
    script = (
        "import os, signal, time, numpy as np, hora\n"
        "hora.init()\n"
        "if hora.rank() == 1:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(0.2)\n"
        "hora.allreduce(np.ones(4))\n"
    )
    result = horarun("-np", "3", sys.executable, "-c", script, timeout=50)
    assert result.returncode == 128 + 9, result.stderr
    assert "horarun: rank 1 was killed by signal 9 (SIGKILL); stopped the other workers." in result.stderr


# A start timeout far above anything a loaded machine needs, so "failed before it" proves the fail-fast.
_LONG_START_TIMEOUT = 120


@pytest.mark.timeout(180)
def test_a_worker_that_exits_without_init_fails_the_job_at_once() -> None:
    script = "import os, hora\nif os.environ['HORA_WORKER_INDEX'] == '1':\n    raise SystemExit(0)\nhora.init()\n"
    started = time.monotonic()
    result = horarun("-np", "2", "--start-timeout", str(_LONG_START_TIMEOUT), sys.executable, "-c", script,
                     timeout=_LONG_START_TIMEOUT + 40)  # fmt: skip
    assert time.monotonic() - started < _LONG_START_TIMEOUT / 2, result.stderr  # not the start timeout
    assert result.returncode == 1, result.stderr
    assert (
        "horarun: rank 1 (slot 1 on localhost) exited with code 0 before it registered with the driver service"
        in result.stderr
    )


@pytest.mark.timeout(180)
def test_a_worker_that_exits_instead_of_joining_a_later_round_fails_the_job_at_once() -> None:
    # Slot 0 calls shutdown() then init() again; slot 1 ends after the first round: round 1 can never fill.
    script = (
        "import os, hora\n"
        "hora.init()\n"
        "hora.shutdown()\n"
        "if os.environ['HORA_WORKER_INDEX'] == '1':\n"
        "    raise SystemExit(0)\n"
        "hora.init()\n"
    )
    started = time.monotonic()
    result = horarun("-np", "2", "--start-timeout", str(_LONG_START_TIMEOUT), sys.executable, "-c", script,
                     timeout=_LONG_START_TIMEOUT + 40)  # fmt: skip
    assert time.monotonic() - started < _LONG_START_TIMEOUT / 2, result.stderr  # not the start timeout
    assert result.returncode == 1, result.stderr
    assert (
        "horarun: rank 1 (slot 1 on localhost) exited with code 0 before it registered with the driver service"
        in result.stderr
    ), result.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("ending", "code", "said"),
    [("raise SystemExit(3)", 3, "exited with code 3"), ("os.kill(os.getpid(), 9)", 128 + 9, "was killed by signal 9")],
)
def test_a_worker_that_fails_before_init_while_others_wait_is_named_at_once(
    tmp_path: Path, ending: str, code: int, said: str
) -> None:
    # Slot 0 says it is about to register; slot 1 gives it time to be waiting in hora.init(), then ends.
    ready = tmp_path / "ready"
    script = (
        "import os, time, hora\n"
        "if os.environ['HORA_WORKER_INDEX'] == '0':\n"
        f"    open({str(ready)!r}, 'w').close()\n"
        "    hora.init()\n"
        "else:\n"
        f"    while not os.path.exists({str(ready)!r}):\n"
        "        time.sleep(0.05)\n"
        "    time.sleep(2)\n"
        f"    {ending}\n"
    )
    started = time.monotonic()
    result = horarun("-np", "2", "--start-timeout", str(_LONG_START_TIMEOUT), sys.executable, "-c", script,
                     timeout=_LONG_START_TIMEOUT + 40)  # fmt: skip
    assert time.monotonic() - started < _LONG_START_TIMEOUT / 2, result.stderr  # not the start timeout
    assert result.returncode == code, result.stderr
    assert f"horarun: rank 1 (slot 1 on localhost) {said}" in result.stderr, result.stderr
    assert "before it registered with the driver service, while other workers wait for it" in result.stderr


@pytest.mark.timeout(60)
def test_commands_that_never_call_init_may_end_at_different_times() -> None:
    script = "import os, time\ntime.sleep(int(os.environ['HORA_WORKER_INDEX']) * 1.0)\nprint('done')\n"
    result = horarun("-np", "2", sys.executable, "-c", script, timeout=50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("done") == 2


@pytest.mark.timeout(60)
def test_a_failing_rank_still_names_itself_with_its_code() -> None:
    result = horarun("-np", "2", sys.executable, "-c", "import hora, sys; hora.init(); sys.exit(hora.rank() + 4)")
    assert result.returncode in (4, 5), result.stderr
    assert f"rank {result.returncode - 4} exited with code {result.returncode}" in result.stderr
