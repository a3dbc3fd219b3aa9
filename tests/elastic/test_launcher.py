"""horarun's elastic mode end to end: a worker dies, hosts come and go, a host is blacklisted, limits hold.

Every job trains tests/elastic/linear.py, whose weights equal one process
stepping through the same global batches as long as no committed step is lost
or repeated, however the job shrinks or grows (see ``linear.reference``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, horarun
from tests.elastic import linear

pytestmark = pytest.mark.timeout(180)

TWO_HOSTS = ("-H", "localhost:2,127.0.0.1:1")
# A discovered job listens on every address unless told an interface: the tests keep to loopback.
LOOPBACK = ("--network-interface", "lo")


def _train(tmp_path: Path, *flags: str, **env: str) -> tuple[int, str, dict | None]:
    """Runs the elastic linear job; returns horarun's exit code, its stderr and rank 0's result (if any)."""
    out = tmp_path / "out.json"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), ELASTIC_OUT=str(out), **env)
    result = horarun(*flags, sys.executable, "-m", "tests.elastic.linear", env=environ, timeout=150)
    return result.returncode, result.stderr, json.loads(out.read_text()) if out.exists() else None


def _assert_reference(result: dict | None, sizes: list[int]) -> None:
    assert result is not None
    assert result["sizes"] == sizes
    assert result["steps"] == linear.EPOCHS * linear.SAMPLES // linear.GLOBAL_BATCH
    # The process set of ranks 0 and 1 given to init, registered again by every reset: the global set's id
    # when the job is just those two.
    assert result["pair"] == (0 if sizes[-1] == 2 else 1)
    np.testing.assert_allclose(result["weights"], linear.reference(), rtol=1e-9)


def _discovery(tmp_path: Path, text: str) -> tuple[Path, str]:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(text)
    return hosts, f"cat {hosts}"


def test_killing_one_of_three_workers_mid_epoch_the_others_finish_from_the_last_commit(tmp_path: Path) -> None:
    # Five steps done, the last commit after four: the fifth is lost and taken again by the two survivors.
    code, stderr, result = _train(
        tmp_path, "-np", "3", "--min-np", "2", *TWO_HOSTS, ELASTIC_KILL_HOST="127.0.0.1", ELASTIC_KILL_STEP="5"
    )
    assert code == 0, stderr
    assert "worker 2 on 127.0.0.1 was killed by signal 9 (SIGKILL); blacklisted 127.0.0.1 for good" in stderr
    _assert_reference(result, [3, 2])


def test_a_host_added_by_discovery_joins_at_the_next_commit(tmp_path: Path) -> None:
    hosts, script = _discovery(tmp_path, "localhost:2\n")
    code, stderr, result = _train(
        tmp_path, "-np", "2", "--host-discovery-script", script, *LOOPBACK,
        ELASTIC_HOSTS_FILE=str(hosts), ELASTIC_HOSTS_AT="3", ELASTIC_HOSTS_TEXT="localhost:2\n127.0.0.1\n",
        ELASTIC_STEP_SLEEP="0.4",
    )  # fmt: skip
    assert code == 0, stderr
    assert "started worker 2 on 127.0.0.1; it joins the job at the next commit" in stderr
    _assert_reference(result, [2, 3])


def test_a_host_removed_by_discovery_leaves_at_the_next_commit(tmp_path: Path) -> None:
    hosts, script = _discovery(tmp_path, "localhost:2\n127.0.0.1:1\n")
    code, stderr, result = _train(
        tmp_path, "-np", "3", "--min-np", "2", "--host-discovery-script", script, *LOOPBACK,
        ELASTIC_HOSTS_FILE=str(hosts), ELASTIC_HOSTS_AT="3", ELASTIC_HOSTS_TEXT="localhost:2\n",
        ELASTIC_STEP_SLEEP="0.4",
    )  # fmt: skip
    assert code == 0, stderr
    assert "worker 2 on 127.0.0.1 leaves the job at its next commit" in stderr
    _assert_reference(result, [3, 2])


def test_a_host_whose_workers_keep_failing_is_blacklisted_again_after_each_cooldown(tmp_path: Path) -> None:
    code, stderr, result = _train(
        tmp_path, "-np", "3", "--min-np", "2", *TWO_HOSTS, "--blacklist-cooldown-range", "1", "2",
        ELASTIC_FAIL_HOST="127.0.0.1", ELASTIC_STEP_SLEEP="0.5",
    )  # fmt: skip
    assert code == 0, stderr
    assert stderr.count("on 127.0.0.1 exited with code 3; blacklisted 127.0.0.1 for 2 s") >= 2, stderr
    assert "started worker 3 on 127.0.0.1" in stderr  # back after its cooldown
    assert result is not None
    np.testing.assert_allclose(result["weights"], linear.reference(), rtol=1e-9)


def test_the_job_fails_past_its_reset_limit(tmp_path: Path) -> None:
    code, stderr, _ = _train(
        tmp_path, "-np", "3", "--min-np", "2", *TWO_HOSTS, "--reset-limit", "0",
        ELASTIC_KILL_HOST="127.0.0.1", ELASTIC_KILL_STEP="5",
    )  # fmt: skip
    assert code == 1
    assert "Hora stopped the elastic job because the number of resets exceeded its limit: 0 (--reset-limit)" in stderr


def test_fewer_workers_than_min_np_for_longer_than_the_elastic_timeout_fails_naming_the_hosts(tmp_path: Path) -> None:
    code, stderr, _ = _train(
        tmp_path, "-np", "3", "--min-np", "3", *TWO_HOSTS, "--elastic-timeout", "3",
        ELASTIC_KILL_HOST="127.0.0.1", ELASTIC_KILL_STEP="5",
    )  # fmt: skip
    assert code == 1
    # The launcher or the waiting round times out first, each naming --min-np and the hosts.
    assert "3 (--min-np)" in stderr or "the 3 needed (--min-np)" in stderr, stderr
    assert "localhost:2, 127.0.0.1:1 (blacklisted)" in stderr, stderr


def test_a_failing_discovery_script_fails_the_job_at_once(tmp_path: Path) -> None:
    result = horarun("--host-discovery-script", "echo nothing here >&2; exit 4", sys.executable, "-c", "pass")
    assert result.returncode == 2
    assert "The host discovery script 'echo nothing here >&2; exit 4' failed with exit code 4: nothing here" in (
        result.stderr
    )


def test_the_example_survives_the_flips_between_one_and_two_slots(tmp_path: Path) -> None:
    """The example's discovery offers 2 slots and 1 in turn (every 5 s): the job grows, shrinks, finishes."""
    examples = ROOT / "examples" / "elastic"
    result = horarun(
        "-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(examples / "discover_hosts.sh"),
        *LOOPBACK,
        sys.executable, str(examples / "digits.py"), "--epochs", "120",
        env=dict(os.environ, FLIP_SECONDS="5"), timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    counts = [line for line in result.stdout.splitlines() if "epochs on 1 worker" in line]
    assert counts, result.stdout[-3000:]
    on_one, on_two = (int(part.rsplit(" ", 1)[1]) for part in counts[0].split(":", 1)[1].split(","))
    assert on_one + on_two == 120 and on_one > 0 and on_two > 0, counts[0]
    assert "leaves the job at its next commit" in result.stderr
    accuracy = float(result.stdout.rsplit("test accuracy ", 1)[1].split()[0])
    assert accuracy > 0.9


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_keras_job_survives_a_killed_worker_on_every_backend(tmp_path: Path, backend: str) -> None:
    """The peer is lost inside Keras's compiled step; TensorFlow and JAX wrap the error, run() still knows it."""
    pytest.importorskip(backend)
    out = tmp_path / "out.json"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), ELASTIC_OUT=str(out), KERAS_BACKEND=backend,
                   TF_CPP_MIN_LOG_LEVEL="3", ELASTIC_KILL_HOST="127.0.0.1", ELASTIC_KILL_STEP="5")  # fmt: skip
    result = horarun("-np", "3", "--min-np", "2", *TWO_HOSTS, sys.executable, "-m", "tests.elastic.keras_linear",
                     env=environ, timeout=150)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "A collective failed (Rank 0 lost its connection to rank 2" in result.stderr
    done = json.loads(out.read_text())
    assert done["sizes"] == [3, 2] and done["steps"] == 16
    np.testing.assert_allclose(done["weights"], linear.reference(), rtol=1e-5)
