"""ElasticRayExecutor on a local Ray (2 CPUs, 4 slots of half a CPU): a dead actor is replaced, training goes on."""

from __future__ import annotations

import os

import hora
import numpy as np
import pytest
from hora.exceptions import HoraError
from hora.ray import ElasticRayExecutor

from tests.conftest import ROOT
from tests.elastic import linear

pytestmark = pytest.mark.timeout(180)


def test_a_killed_actor_is_replaced_and_training_goes_on_from_the_last_commit(ray_cluster) -> None:
    env = {"ELASTIC_KILL_INDEX": "2", "ELASTIC_KILL_STEP": "5", "PYTHONPATH": str(ROOT)}
    executor = ElasticRayExecutor(min_workers=2, max_workers=3, num_workers=3, cpus_per_worker=0.5, env=env,
                                  elastic_timeout=60)  # fmt: skip
    assert executor.discover() == {ray_cluster.get_runtime_context().get_node_id(): 4}
    results = executor.run(linear.train_job)
    assert len(results) >= 2 and all(r == results[0] for r in results)  # every rank of the last round
    assert results[0]["sizes"][0] == 3 and results[0]["steps"] == 16
    assert results[0]["pair"] == (0 if len(results) == 2 else 1)  # ranks 0 and 1: the global set when alone
    np.testing.assert_allclose(results[0]["weights"], linear.reference(), rtol=1e-9)
    assert not ray_cluster.util.list_named_actors()  # nothing left behind


def test_a_raising_function_fails_the_job_with_its_traceback(ray_cluster) -> None:
    def fails() -> None:
        hora.init()
        if os.environ["HORA_WORKER_INDEX"] == "1":
            raise ValueError("boom on purpose")
        hora.barrier()

    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=2, verbose=True)  # Horovod's form
    executor = ElasticRayExecutor(settings, cpus_per_slot=0.5)
    assert (executor.min_workers, executor.num_workers, executor.max_workers, executor.timeout_s) == (2, 2, 2, 30.0)
    with pytest.raises(HoraError, match=r"(?s)worker 1 on \w+ exited with code 1; stopped the job\..*boom on purpose"):
        executor.run(fails)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_workers": 0}, "min_workers must be a positive integer, got 0"),
        ({"min_workers": 3, "max_workers": 2}, r"Expected min_workers <= num_workers <= max_workers, got 3, 3 and 2"),
        ({"cpus_per_worker": 0}, "cpus_per_worker must be positive, got 0"),
        ({"cpus_per_worker": 1, "cpus_per_slot": 1}, "Give cpus_per_worker or Horovod's cpus_per_slot, not both"),
        ({"settings": ElasticRayExecutor.create_settings(), "reset_limit": 2}, "Give reset_limit in the settings or"),
        ({"override_discovery": False}, r"discovers the Ray cluster's nodes itself: override_discovery=False"),
    ],
)
def test_bad_arguments_are_refused_quoting_them(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ElasticRayExecutor(**kwargs)


def test_settings_come_first_or_not_at_all() -> None:
    with pytest.raises(TypeError, match=r"first argument is Horovod's settings .* got 2; give the bounds as min_work"):
        ElasticRayExecutor(2)
    with pytest.raises(ValueError, match=r"one network interface; give nics=\{'eth0'\}, got"):
        ElasticRayExecutor.create_settings(nics={"eth0", "eth1"})
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3, nics={"lo"}))
    assert (executor.min_workers, executor.max_workers, executor.env) == (2, 3, {"HORA_NETWORK_INTERFACE": "lo"})
