"""The engine across real processes: negotiation, fusion, join, process sets, timeline, stalls, failures."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import horarun


def run(scenario: str, size: int, *args: str, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()):
    environ = dict(os.environ, **(env or {}))
    return horarun(
        "-np",
        str(size),
        *flags,
        sys.executable,
        "-m",
        "tests.core.engine_cases",
        scenario,
        *args,
        timeout=100,
        env=environ,
    )


def assert_ok(result) -> None:
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_shuffled_submission_orders_give_correct_results(size: int) -> None:
    assert_ok(run("shuffled_orders", size))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "flags", [("--fusion-threshold-mb", "0"), ("--cache-capacity", "0"), ("--cycle-time-ms", "20")]
)
def test_results_do_not_depend_on_fusion_cache_or_cycle_time(flags: tuple[str, ...]) -> None:
    assert_ok(run("shuffled_orders", 3, flags=flags))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_mismatches_fail_on_every_rank_and_the_job_goes_on(size: int) -> None:
    result = run("mismatches", size)
    assert_ok(result)
    assert sorted(re.findall(r"rank (\d+): mismatches ok", result.stdout)) == [str(r) for r in range(size)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_join_with_uneven_steps_returns_the_last_rank(size: int) -> None:
    result = run("uneven_join", size)
    assert_ok(result)
    assert result.stdout.count(f"join returned {size - 1}") == size


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_dropped_handles_neither_crash_nor_change_results(size: int) -> None:
    result = run("dropped_handles", size)
    assert_ok(result)
    assert result.stdout.count("dropped handles ok") == size


@pytest.mark.timeout(120)
def test_two_process_sets_run_at_once() -> None:
    result = run("process_sets", 4)
    assert_ok(result)
    assert result.stdout.count("process sets ok") == 4


@pytest.mark.timeout(120)
def test_init_registers_process_sets() -> None:
    result = run("init_with_process_sets", 3)
    assert_ok(result)
    assert result.stdout.count("init with process sets ok") == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_grouped_operations(size: int) -> None:
    result = run("grouped", size)
    assert_ok(result)
    assert result.stdout.count("grouped ok") == size


@pytest.mark.timeout(120)
def test_timeline_holds_the_named_tensors_phases(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    assert_ok(run("timeline", 2, str(path)))
    events = json.loads(path.read_text())
    pids = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    phases = [e["name"] for e in events if e["ph"] == "B" and pids.get(e["pid"]) == "layer3.weight"]
    assert "NEGOTIATE_ALLREDUCE" in phases, phases
    assert "MEMCPY_IN_FUSION_BUFFER" in phases and "MEMCPY_OUT_FUSION_BUFFER" in phases, phases
    assert "ALLREDUCE" in phases, phases
    assert phases.count("ALLREDUCE") == 3  # one per step
    large = [e["name"] for e in events if e["ph"] == "B" and pids.get(e["pid"]) == "large.weight"]
    assert large.count("ALLREDUCE") == 3 and "MEMCPY_IN_FUSION_BUFFER" not in large, large
    group = {
        n: [e["name"] for e in events if e["ph"] == "B" and pids.get(e["pid"]) == n] for n in ("mixed.0", "mixed.1")
    }
    assert "MEMCPY_IN_FUSION_BUFFER" in group["mixed.0"], group  # small members fuse with each other
    assert group["mixed.1"].count("ALLREDUCE") == 3 and "MEMCPY_IN_FUSION_BUFFER" not in group["mixed.1"], group
    bcast = [e["name"] for e in events if e["ph"] == "B" and pids.get(e["pid"]) == "bcast.me"]
    assert bcast == ["NEGOTIATE_BROADCAST", "BROADCAST"], bcast
    mismatched = [e.get("name", e["ph"]) for e in events if e["ph"] in "BE" and pids.get(e["pid"]) == "mismatched"]
    assert mismatched == ["NEGOTIATE_ALLREDUCE", "E", "NEGOTIATE_ALLREDUCE", "E", "ALLREDUCE", "E"], mismatched
    assert any(e["name"] == "CYCLE_START" for e in events)
    ends = sum(e["ph"] == "E" for e in events)
    assert ends == sum(e["ph"] == "B" for e in events)


@pytest.mark.timeout(120)
def test_timeline_from_the_environment_per_rank(tmp_path: Path) -> None:
    pattern = str(tmp_path / "trace.{rank}.json")
    assert_ok(run("shuffled_orders", 2, flags=("--timeline-filename", pattern)))
    for rank in range(2):
        events = json.loads((tmp_path / f"trace.{rank}.json").read_text())
        names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert "grad.7" in names


HOROVOD_AUTOTUNE_COLUMNS = [
    "hierarchical_allreduce", "hierarchical_allgather", "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold",
    "score",
]  # fmt: skip


def autotune_run(tmp_path: Path, *flags: str) -> tuple[list[dict[str, str]], list[list[float]]]:
    """Runs the autotune scenario; returns the log's rows and every rank's final (fusion bytes, cycle ms, cache)."""
    log = tmp_path / "autotune.csv"
    tuning = ("--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples", "1",
              "--autotune-steps-per-sample", "2")  # fmt: skip
    result = run("autotune", 2, "120", flags=(*tuning, *flags))
    assert_ok(result)
    finals = [json.loads(m) for m in re.findall(r"autotune ok (\[.*\])", result.stdout)]
    assert len(finals) == 2, result.stdout[-2000:]
    with log.open() as handle:
        assert handle.readline().strip().split(",") == HOROVOD_AUTOTUNE_COLUMNS
        rows = [dict(zip(HOROVOD_AUTOTUNE_COLUMNS, line.strip().split(","), strict=True)) for line in handle]
    return rows, finals


@pytest.mark.timeout(120)
def test_autotune_tries_each_parameter_and_keeps_the_best(tmp_path: Path) -> None:
    rows, finals = autotune_run(tmp_path)
    trials, best = rows[:-1], rows[-1]
    # fusion threshold (5 candidates), then cycle time (5), then the cache (2); one host: no hierarchy to try
    assert len(trials) == 12, rows
    assert [float(r["tensor_fusion_threshold"]) for r in trials[:5]] == [0, 1, 4, 16, 64]
    assert [float(r["cycle_time_ms"]) for r in trials[5:10]] == [0.5, 1, 2.5, 5, 10]
    assert [r["cache_enabled"] for r in trials[10:]] == ["1", "0"]
    scores = [float(r["score"]) for r in trials]
    winner = trials[scores.index(max(scores))]
    assert float(best["score"]) == max(scores) > 0
    assert {k: v for k, v in best.items() if k != "score"} == {k: v for k, v in winner.items() if k != "score"}
    # every rank ends with the best parameters
    fusion, cycle, cache = (float(best[k]) for k in ("tensor_fusion_threshold", "cycle_time_ms", "cache_enabled"))
    expected = [fusion * 2**20, cycle, cache]
    assert finals == [expected, expected]


@pytest.mark.timeout(120)
def test_autotune_leaves_explicit_settings_alone(tmp_path: Path) -> None:
    rows, finals = autotune_run(tmp_path, "--fusion-threshold-mb", "8")
    assert len(rows) == 7 + 1, rows  # cycle time and cache only
    assert {float(r["tensor_fusion_threshold"]) for r in rows} == {8.0}
    assert all(final[0] == 8 * 2**20 for final in finals)


@pytest.mark.timeout(120)
def test_native_warnings_go_to_pythons_logging() -> None:
    result = run("stall_logged", 2, flags=("--stall-check-warning-time-seconds", "1"))
    assert_ok(result)
    for rank in range(2):
        assert f"[{rank}]<stdout>:LOGGED hora WARNING [hora rank {rank}] WARNING: stalled requests" in result.stdout
    assert "stalled requests" not in result.stderr  # not written by the core itself as well


@pytest.mark.timeout(120)
def test_stall_warning_names_the_missing_rank_on_every_rank() -> None:
    result = run("stall", 2, flags=("--stall-check-warning-time-seconds", "1"))
    assert_ok(result)
    for rank in range(2):
        lines = [line for line in result.stderr.splitlines() if line.startswith(f"[{rank}]<stderr>:")]
        text = "\n".join(lines)
        assert "stalled requests" in text, result.stderr
        assert re.search(
            r"tensor 'late.tensor' \(allreduce\) submitted by ranks 0 has waited \d+ s for ranks 1", text
        ), text


@pytest.mark.timeout(120)
def test_stall_check_can_be_disabled() -> None:
    result = run("stall", 2, env={"HORA_STALL_CHECK_TIME_SECONDS": "1", "HORA_STALL_CHECK_DISABLE": "1"})
    assert_ok(result)
    assert "stalled" not in result.stderr


@pytest.mark.timeout(120)
def test_stall_shutdown_turns_a_hang_into_an_error() -> None:
    result = run("stall_shutdown", 2, env={"HORA_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert_ok(result)
    for rank in range(2):
        match = re.search(rf"rank {rank}: HoraError after ([\d.]+) s: (.*)", result.stdout)
        assert match, result.stdout + result.stderr
        assert float(match.group(1)) < 20
    assert "never.matched" in result.stdout and "stall shutdown time" in result.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_sigkilled_peer_fails_the_pending_handles(size: int) -> None:
    result = run("killed_with_pending", size, env={"HORA_TIMEOUT": "30"})
    assert result.returncode != 0  # the launcher reports the killed rank
    for rank in range(size - 1):
        match = re.search(rf"rank {rank}: (\d+) pending failed after ([\d.]+) s; later: (.*)", result.stdout)
        assert match, result.stdout + result.stderr
        assert int(match.group(1)) == 10
        assert float(match.group(2)) < 30  # through the closed connection, not the timeout


@pytest.mark.timeout(120)
def test_handles_poll_and_duplicate_names() -> None:
    result = run("handles", 2)
    assert_ok(result)
    assert result.stdout.count("handles ok") == 2


@pytest.mark.timeout(120)
def test_response_cache_with_fewer_slots_than_tensors() -> None:
    result = run("cache_eviction", 3, flags=("--cache-capacity", "5"))
    assert_ok(result)
    assert result.stdout.count("cache ok") == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_callers_drive_the_engine_and_the_background_thread_serves_the_rest(size: int) -> None:
    result = run("caller_driven", size)
    assert_ok(result)
    assert result.stdout.count("caller driven ok") == size
