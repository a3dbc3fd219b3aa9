"""horarun end to end: output prefixes, failures, ssh, Ctrl-C, host parsing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hora.runner.cli import make_parser
from hora.runner.config import config_from_args
from hora.runner.guard import share_of_cores
from hora.runner.hosts import HostSlots, parse_hostfile, parse_hosts, slots_for
from hora.settings import Settings

from tests.conftest import ROOT, horarun
from tests.runner.processes import assert_gone, wait_for_pids

PRINT_RANK = "import hora; hora.init(); print('hello from', hora.rank(), 'of', hora.size(), hora.local_rank())"


@pytest.mark.timeout(60)
def test_lines_are_prefixed_with_the_rank(tmp_path: Path) -> None:
    result = horarun("-np", "3", "--output-filename", str(tmp_path), sys.executable, "-c", PRINT_RANK)
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert f"[{rank}]<stdout>:hello from {rank} of 3 {rank}" in result.stdout.splitlines()
        assert (tmp_path / f"rank.{rank}" / "stdout").read_text() == f"hello from {rank} of 3 {rank}\n"


@pytest.mark.timeout(60)
def test_failing_worker_stops_the_others_and_is_named() -> None:
    script = (
        "import sys, time, hora; hora.init()\n"
        "if hora.rank() == 1:\n"
        "    print('about to fail', flush=True); sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = horarun("-np", "3", sys.executable, "-c", script)
    assert result.returncode == 3
    assert time.monotonic() - start < 30  # the sleeping ranks were stopped, not waited for
    assert "rank 1 exited with code 3" in result.stderr
    assert "[1]<stdout>:about to fail" in result.stderr  # the last lines are shown


@pytest.mark.timeout(60)
def test_remote_hosts_go_through_ssh(fake_ssh: tuple[dict[str, str], Path]) -> None:
    env, log = fake_ssh
    result = horarun(
        "-H", "localhost:1,nodeb:2", "-np", "3", "--network-interface", "lo",
        sys.executable, "-c", PRINT_RANK, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert log.read_text().split() == ["nodeb", "nodeb"]
    assert "[0]<stdout>:hello from 0 of 3 0" in result.stdout
    assert "[2]<stdout>:hello from 2 of 3 1" in result.stdout  # second rank on nodeb: local rank 1


@pytest.mark.timeout(60)
def test_remote_workers_stop_when_the_launcher_is_killed(tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]) -> None:
    env, _ = fake_ssh
    pids = tmp_path / "pids"
    script = f"import os, time, hora; hora.init(); open('{pids}', 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    command = [sys.executable, "-m", "hora.runner", "-H", "nodeb:2", "--network-interface", "lo"]
    proc = subprocess.Popen([*command, sys.executable, "-c", script], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    workers = wait_for_pids(pids, 2)
    proc.kill()  # no chance to clean up: only the guard's closed stdin tells the remote side
    proc.wait(timeout=10)
    assert_gone(workers)


@pytest.mark.timeout(60)
def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"import os, time, hora; hora.init(); open('{pids}', 'a').write(f'{{os.getpid()}}\\n'); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "interrupted" in err
    assert_gone([int(pid) for pid in pids.read_text().split()], within=1.0)


@pytest.mark.timeout(60)
def test_worker_that_never_starts_fails_rendezvous_with_names() -> None:
    script = "import os, time, hora\nif os.environ['HORA_WORKER_INDEX'] == '1': time.sleep(30)\nhora.init()"
    result = horarun("-np", "2", "--start-timeout", "2", sys.executable, "-c", script)
    assert result.returncode != 0
    assert "1 of 2 workers registered after 2 s; missing ranks 1 on host localhost" in result.stderr


def test_bad_arguments_exit_2_with_the_value() -> None:
    result = horarun("-np", "5", "-H", "a:2,b:2", "true")
    assert result.returncode == 2
    assert "-np 5 asks for more processes than the 4 slots of a:2,b:2" in result.stderr


def test_host_parsing(tmp_path: Path) -> None:
    assert parse_hosts("a:2,b") == [HostSlots("a", 2), HostSlots("b", 1)]
    with pytest.raises(ValueError, match="Bad host entry 'a:x'"):
        parse_hosts("a:x")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4\nnode2:2\n\nnode3\n")
    assert parse_hostfile(str(hostfile)) == [HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 1)]
    assert slots_for([HostSlots("a", 2), HostSlots("b", 2)], 3) == ["a", "a", "b"]


def test_engine_flags_become_worker_settings() -> None:
    args = make_parser().parse_args(
        [
            "-np", "2", "--fusion-threshold-mb", "0.5", "--cycle-time-ms", "3", "--cache-capacity", "0",
            "--timeline-filename", "t.json", "--timeline-mark-cycles", "--no-stall-check",
            "--stall-check-shutdown-time-seconds", "90", "python", "x.py",
        ]
    )  # fmt: skip
    environ = dict(config_from_args(args).engine_env)
    settings = Settings.from_env(environ)
    assert settings.fusion_threshold_bytes == 512 * 1024
    assert (settings.cycle_time_ms, settings.cache_capacity, settings.timeline_filename) == (3.0, 0, "t.json")
    assert settings.timeline_mark_cycles and settings.stall_warning_seconds == 0.0
    assert settings.stall_shutdown_seconds == 90.0
    defaults = Settings.from_env(dict(config_from_args(make_parser().parse_args(["python", "x.py"])).engine_env))
    assert (defaults.cache_capacity, defaults.stall_warning_seconds, defaults.timeline_filename) == (1024, 60.0, None)
    with pytest.raises(ValueError, match="--cache-capacity must be >= 0, got -1"):
        config_from_args(make_parser().parse_args(["--cache-capacity", "-1", "python", "x.py"]))
    with pytest.raises(ValueError, match="--autotune-steps-per-sample must be >= 1, got 0"):
        config_from_args(make_parser().parse_args(["--autotune-steps-per-sample", "0", "python", "x.py"]))
    tuning = ["--autotune", "--autotune-log-file", "t.csv", "--autotune-warmup-samples", "2", "python", "x.py"]
    tuned = Settings.from_env(dict(config_from_args(make_parser().parse_args(tuning)).engine_env))
    assert (tuned.autotune, tuned.autotune_log, tuned.autotune_warmup_samples) == (True, "t.csv", 2)
    assert (defaults.transport, defaults.hierarchical_allreduce) == ("auto", None)
    for flags, expected in [
        (["--transport", "tcp", "--hierarchical-allreduce"], ("tcp", True)),
        (["--no-hierarchical-allreduce"], ("auto", False)),
    ]:
        chosen = Settings.from_env(
            dict(config_from_args(make_parser().parse_args([*flags, "python", "x.py"])).engine_env)
        )
        assert (chosen.transport, chosen.hierarchical_allreduce) == expected


@pytest.mark.timeout(60)
def test_a_closed_output_pipe_does_not_break_the_launcher() -> None:
    script = "import hora; hora.init()\nfor i in range(5000): print(i)\n"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout.readline().endswith(b":0\n")
    proc.stdout.close()  # like `horarun ... | head -1`
    _, stderr = proc.communicate(timeout=50)
    assert proc.returncode == 0, stderr
    assert b"BrokenPipeError" not in stderr, stderr


def test_start_timeout_comes_from_the_flag_else_the_environment_else_30(monkeypatch) -> None:
    def start_timeout(*flags: str) -> float:
        return config_from_args(make_parser().parse_args([*flags, "python", "train.py"])).start_timeout

    monkeypatch.delenv("HORA_START_TIMEOUT", raising=False)
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    assert start_timeout() == 30.0
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "45")  # as horovodrun reads it
    assert start_timeout() == 45.0
    monkeypatch.setenv("HORA_START_TIMEOUT", "50")
    assert start_timeout() == 50.0
    assert start_timeout("--start-timeout", "7") == 7.0
    monkeypatch.setenv("HORA_START_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"HORA_START_TIMEOUT='soon' is not a number"):
        start_timeout()


def test_x_name_alone_passes_on_the_launchers_value(monkeypatch) -> None:
    def env(*flags: str) -> tuple[tuple[str, str], ...]:
        return config_from_args(make_parser().parse_args([*flags, "python", "train.py"])).env

    monkeypatch.setenv("X_FLAG_TEST_VALUE", "from-the-shell")
    assert env("-x", "A=1", "-x", "X_FLAG_TEST_VALUE", "-x", "B=") == (
        ("A", "1"), ("X_FLAG_TEST_VALUE", "from-the-shell"), ("B", ""),
    )  # fmt: skip
    monkeypatch.delenv("X_FLAG_TEST_VALUE")
    with pytest.raises(ValueError, match=r"-x X_FLAG_TEST_VALUE: X_FLAG_TEST_VALUE is not set in horarun's"):
        env("-x", "X_FLAG_TEST_VALUE")


@pytest.mark.timeout(60)
def test_prefix_output_with_timestamp() -> None:
    import re

    result = horarun("-np", "2", "-prefix-timestamp", sys.executable, "-c", PRINT_RANK)
    assert result.returncode == 0, result.stderr
    for rank in range(2):  # horovodrun's format: time.asctime(), then the rank prefix
        pattern = rf"\w{{3}} \w{{3}} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\[{rank}\]<stdout>:hello from {rank} of 2 {rank}"
        assert any(re.fullmatch(pattern, line) for line in result.stdout.splitlines()), result.stdout
    refused = horarun("--mpi", "--prefix-output-with-timestamp", sys.executable, "-c", "pass")
    assert refused.returncode == 2
    assert "--prefix-output-with-timestamp applies to the output horarun relays" in refused.stderr


AFFINITY = "import os; print(os.environ['HORA_LOCAL_RANK'], sorted(os.sched_getaffinity(0)))"


def test_share_of_cores_splits_the_allowed_cores_evenly_and_wraps_when_ranks_outnumber_them() -> None:
    assert [share_of_cores([0, 1], r, 2) for r in range(2)] == [[0], [1]]
    assert [share_of_cores([3, 2, 1, 0], r, 2) for r in range(2)] == [[0, 1], [2, 3]]
    assert [share_of_cores([0, 1, 2], r, 2) for r in range(2)] == [[0], [1]]  # every rank gets as many
    assert [share_of_cores([4, 6], r, 4) for r in range(4)] == [[4], [6], [4], [6]]
    with pytest.raises(ValueError, match="local rank 2 of 2"):
        share_of_cores([0, 1], 2, 2)


@pytest.mark.timeout(60)
def test_bind_cores_gives_each_local_rank_its_share_of_the_launchers_cores() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    result = horarun("-np", "2", "--bind-cores", sys.executable, "-c", AFFINITY)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        assert f"[{rank}]<stdout>:{rank} {share_of_cores(allowed, rank, 2)}" in result.stdout.splitlines()
    unbound = horarun("-np", "2", sys.executable, "-c", AFFINITY)
    assert unbound.returncode == 0, unbound.stderr
    assert f"[1]<stdout>:1 {allowed}" in unbound.stdout.splitlines()


@pytest.mark.timeout(60)
def test_a_bad_bind_setting_stops_the_worker_before_it_starts_and_quotes_it() -> None:
    env = dict(os.environ, HORA_BIND_CORES="maybe")
    result = horarun("-np", "1", sys.executable, "-c", "print('started')", env=env)
    assert result.returncode == 1
    assert "HORA_BIND_CORES='maybe' is not a boolean; expected 1/0, true/false, yes/no or on/off. Not starting." in (
        result.stderr
    )
    assert "started" not in result.stdout


def test_bind_cores_is_refused_with_mpi_naming_mpiexecs_own_option() -> None:
    with_mpi = horarun("--mpi", "--bind-cores", "-np", "2", "true")
    assert with_mpi.returncode == 2
    assert "with --mpi, mpiexec places the ranks" in with_mpi.stderr
    assert "'-bind-to core'" in with_mpi.stderr
