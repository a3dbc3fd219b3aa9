"""hora.keras between real processes, on Keras's TensorFlow, JAX and torch backends: fit, callbacks, load_model."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.conftest import horarun
from tests.torch.test_torch import run_worker

pytest.importorskip("keras", reason="needs keras: pip install 'hora[tensorflow]'")

BACKENDS = {"tensorflow": 13, "jax": 11, "torch": 10}  # backend -> the fewest cases a rank must run


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_fit_cases(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", backend)
    run_worker("tests.keras.fit_cases", 2, (), BACKENDS[backend])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_horovod_keras_script_trains(backend: str) -> None:
    env = dict(os.environ, KERAS_BACKEND=backend)
    result = horarun("-np", "2", sys.executable, "examples/keras/mnist_style.py", timeout=220, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([\d.]+)", result.stdout).group(1))
    assert accuracy >= 0.9, result.stdout[-2000:]
    assert re.search(r"\[0\]<stdout>:weights identical on 2 ranks", result.stdout), result.stdout[-2000:]


def test_horovods_keras_module_names_import() -> None:
    # Horovod's scripts import the submodules of horovod.tensorflow.keras by name.
    import hora.keras.callbacks
    import hora.keras.elastic
    from hora.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback
    from hora.tensorflow.keras.elastic import KerasState

    assert BroadcastGlobalVariablesCallback is hora.keras.callbacks.BroadcastGlobalVariablesCallback
    assert KerasState is hora.keras.elastic.KerasState
