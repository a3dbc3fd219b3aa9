"""Tune sweeps whose trials are 2-worker Hora jobs: rank 0's metrics reach Tune; stopped trials leave nothing;
an elastic trial goes on when a worker dies."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from pathlib import Path

import hora
import hora.ray.tune
import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)


def _score(config: dict) -> None:
    """Reports, per iteration, a score that peaks at lr = 0.1; rank 1 reports nonsense that must not arrive."""
    if config.get("pid_dir"):
        with open(os.path.join(config["pid_dir"], f"{os.getpid()}.pid"), "w"):
            pass
    for iteration in range(1, config["iterations"] + 1):
        mine = -((config["lr"] - 0.1) ** 2) * 100 + iteration
        agreed = float(hora.allreduce(np.array([mine]), op=hora.Average, name=f"score.{iteration}")[0])
        checkpoint = None
        if config.get("checkpoint") and hora.rank() == 0:
            checkpoint = tempfile.mkdtemp()
            with open(os.path.join(checkpoint, "state.txt"), "w") as f:
                f.write(str(iteration))
        hora.ray.tune.report({"score": agreed if hora.rank() == 0 else 1e9, "rank": hora.rank()}, checkpoint)
        time.sleep(config.get("pause", 0.0))


def test_a_grid_sweep_reports_rank_0_and_finds_the_best_lr(ray_cluster, tmp_path) -> None:
    from ray import tune

    trainable = hora.ray.tune.distributed_trainable(_score, num_workers=2, cpus_per_worker=0.25)
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.001, 0.1, 1.0]), "iterations": 3, "checkpoint": True},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(verbose=0, storage_path=str(tmp_path / "results")),
    )
    results = tuner.fit()
    assert len(results) == 3 and not results.errors
    for result in results:
        assert result.metrics["rank"] == 0 and result.metrics["training_iteration"] == 3
        assert result.metrics["score"] == pytest.approx(-((result.config["lr"] - 0.1) ** 2) * 100 + 3)
    best = results.get_best_result()
    assert best.config["lr"] == 0.1
    with best.checkpoint.as_directory() as directory:  # rank 0's last checkpoint reached Tune
        assert Path(directory, "state.txt").read_text() == "3"


def test_the_tune_sweep_example_prints_the_best_lr() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "examples/ray/tune_sweep.py", "--epochs", "3"], cwd=ROOT,
                            capture_output=True, text=True, timeout=280)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"best config: lr=0\.3 \(val_accuracy 0\.\d+\)", result.stdout), result.stdout[-2000:]


def test_asha_stopped_trials_leave_no_workers_behind(ray_cluster, tmp_path) -> None:
    from ray import tune

    trainable = hora.ray.tune.distributed_trainable(_score, num_workers=2, cpus_per_worker=0.25)
    scheduler = tune.schedulers.ASHAScheduler(max_t=6, grace_period=1, reduction_factor=3)
    tuner = tune.Tuner(
        trainable,
        param_space={
            "lr": tune.grid_search([0.1, 0.5, 1.0, 2.0]),
            "iterations": 6,
            "pause": 0.2,
            "pid_dir": str(tmp_path),
        },
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=scheduler),
        run_config=tune.RunConfig(verbose=0, storage_path=str(tmp_path / "results")),
    )
    results = tuner.fit()
    iterations = sorted(r.metrics["training_iteration"] for r in results)
    assert iterations[0] < 6 == iterations[-1], iterations  # some trials were stopped early
    deadline = time.monotonic() + 30
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 8  # 4 trials x 2 workers
    while time.monotonic() < deadline and (ray_cluster.available_resources().get("CPU", 0) < 2.0 or _alive(pids)):
        time.sleep(0.5)
    assert _alive(pids) == [] and ray_cluster.available_resources().get("CPU") == 2.0


def _elastic_sum(config: dict) -> None:
    """Adds the mean of every rank's ``lr`` once per epoch and reports it between the halves of a commit, as the
    elastic trials' docs say. Worker 1 (the first rank 1) SIGKILLs itself before the third epoch; while a rank
    trains alone, each epoch takes ``pause`` seconds, so that the replacement has time to join."""
    hora.init()
    state = hora.elastic.ObjectState(epoch=0, total=0.0)

    @hora.elastic.run
    def train(state: hora.elastic.ObjectState) -> None:
        while state.epoch < config["epochs"]:
            if state.epoch == 2 and os.environ["HORA_WORKER_INDEX"] == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            mean = hora.allreduce(np.array([config["lr"]]), op=hora.Average, name=f"sum.{state.epoch}")
            workers = hora.allgather(np.array([int(os.environ["HORA_WORKER_INDEX"])]), name=f"who.{state.epoch}")
            state.total += float(mean[0])
            state.epoch += 1
            state.save()  # no reset undoes this epoch from here on: Tune may see it
            hora.ray.tune.report({"epoch": state.epoch, "total": state.total, "workers": sorted(workers.tolist())})
            state.check_host_updates()  # where the job may re-form (a replacement joins)
            if hora.size() == 1:
                time.sleep(config["pause"])

    train(state)


def test_an_elastic_trial_replaces_a_dead_worker_and_goes_on_from_the_last_commit(ray_cluster, tmp_path) -> None:
    from ray import tune

    trainable = hora.ray.tune.distributed_trainable(_elastic_sum, num_workers=2, cpus_per_worker=0.25,
                                                    min_workers=1, elastic_timeout=60)  # fmt: skip
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": 0.5, "epochs": 10, "pause": 1.0},
        run_config=tune.RunConfig(verbose=0, storage_path=str(tmp_path / "results")),
    )
    [result] = tuner.fit()
    assert result.error is None, result.error
    history = result.metrics_dataframe
    # Every epoch reported once, in order (none lost or repeated by the reset); the sum as if no one had died.
    assert history["epoch"].tolist() == list(range(1, 11))
    assert history["total"].tolist() == pytest.approx([0.5 * epoch for epoch in range(1, 11)])
    # Worker 1 died before the third epoch; the survivor went on (alone, or at once with the replacement), and
    # worker 2, started in the dead worker's bundle, trained the last epochs with worker 0.
    workers = history["workers"].tolist()
    assert workers[:2] == [[0, 1], [0, 1]] and all(w in ([0], [0, 2]) for w in workers[2:]), workers
    assert workers[-1] == [0, 2], workers
    deadline = time.monotonic() + 30  # the trial's placement group is given back
    while time.monotonic() < deadline and ray_cluster.available_resources().get("CPU", 0) < 2.0:
        time.sleep(0.5)
    assert ray_cluster.available_resources().get("CPU") == 2.0


def test_elastic_trial_bounds_are_checked_when_the_trainable_is_made() -> None:
    with pytest.raises(ValueError, match=r"Expected min_workers <= num_workers <= max_workers, got 3, 2 and 2"):
        hora.ray.tune.distributed_trainable(_elastic_sum, num_workers=2, min_workers=3)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive
