"""hora.tensorflow between real processes: every collective and dtype, gradients, the tape, training, examples.

Each worker script runs its cases on every rank and prints ``rank R: P of T
cases passed``; a test passes when every rank reports every case passed.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import horarun
from tests.torch.test_torch import run_worker

pytest.importorskip("tensorflow", reason="needs tensorflow: pip install 'hora[tensorflow]'")

# (script, ranks, extra horarun arguments, the fewest cases a rank must run)
RUNS = {
    "ops-2-shm": ("tests.tensorflow.op_cases", 2, (), 190),
    "ops-3-shm": ("tests.tensorflow.op_cases", 3, (), 190),
    "ops-2-tcp": ("tests.tensorflow.op_cases", 2, ("--transport", "tcp"), 190),
    "gradients-2": ("tests.tensorflow.gradient_cases", 2, (), 24),
    "gradients-3": ("tests.tensorflow.gradient_cases", 3, (), 24),
    "training-2": ("tests.tensorflow.training_cases", 2, (), 4),
    "training-3": ("tests.tensorflow.training_cases", 3, (), 4),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", list(RUNS))
def test_worker_cases(run: str) -> None:
    run_worker(*RUNS[run])


@pytest.mark.timeout(200)
def test_digits_example_reaches_95_percent() -> None:
    result = horarun("-np", "2", sys.executable, "examples/tensorflow/digits.py", "--epochs", "15", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    epochs = re.findall(r"\[0\]<stdout>:epoch +(\d+) +loss ([\d.]+) +accuracy ([\d.]+)", result.stdout)
    assert [int(e) for e, _, _ in epochs] == list(range(1, 16))
    assert float(epochs[-1][1]) < float(epochs[0][1])  # it learned
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([\d.]+) on 450 images", result.stdout).group(1))
    assert accuracy >= 0.95, result.stdout[-2000:]
    assert "[1]<stdout>:epoch" not in result.stdout  # rank 0 alone reports


@pytest.mark.timeout(120)
def test_synthetic_benchmark_example_runs() -> None:
    arguments = ["--model", "mlp", "--num-iters", "2", "--num-batches-per-iter", "2", "--num-warmup-batches", "1"]
    result = horarun("-np", "2", sys.executable, "examples/tensorflow/synthetic_benchmark.py", *arguments, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"Total img/sec on 2 rank\(s\): [\d.]+ \+-[\d.]+", result.stdout), result.stdout[-2000:]


def test_hora_and_hora_torch_import_no_tensorflow() -> None:
    code = "import sys, hora, hora.torch; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"


def test_one_process_without_a_launcher() -> None:
    # hora.init() outside horarun is a job of one rank: every collective is the identity, eagerly and in a graph.
    code = """
import numpy as np, tensorflow as tf, hora.tensorflow as hvd
hvd.init()
x = tf.constant([[1.0, 2.0]])
step = tf.function(lambda t: (hvd.allreduce(t), hvd.allgather(t), hvd.broadcast(t, 0), hvd.size_op()))
for values in (step(x), (hvd.allreduce(x), hvd.allgather(x), hvd.broadcast(x, 0), hvd.size_op())):
    assert [v.numpy().tolist() for v in values] == [[[1.0, 2.0]]] * 3 + [1], values
v = tf.Variable([3.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(v * v)
assert hvd.DistributedGradientTape(tape).gradient(loss, [v])[0].numpy().tolist() == [6.0]
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr[-3000:]


def counting_crossing_buffers(body: str) -> str:
    """Runs ``body`` in a fresh one-rank process in which ``spares`` lists every crossing's buffers (each
    counting the buffers it allocated in ``fresh``); returns what it printed."""
    code = """
import tensorflow as tf, keras, hora.tensorflow as hvd
from hora.tensorflow import crossing
hvd.init()
spares = []
make = crossing._Spares.__init__
crossing._Spares.__init__ = lambda self: (make(self), spares.append(self))[0]
"""
    result = subprocess.run([sys.executable, "-c", code + body], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_a_large_tensors_crossing_reuses_its_buffer_once_free() -> None:
    # A fresh buffer per step would cost a page fault per 4 KiB every step; one still held by TensorFlow
    # (a result the caller kept) must not be overwritten.
    printed = counting_crossing_buffers("""
consumed = tf.function(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Sum)))
for i in range(5):
    consumed(tf.fill([100_000], float(i)))
returned = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
kept = [returned(tf.fill([100_000], float(i))) for i in range(4)]
print([s.fresh for s in spares], [float(k[0]) for k in kept])
""")
    assert printed == "[1, 4] [0.0, 1.0, 2.0, 3.0]"


def test_a_training_steps_crossings_reuse_their_buffers_while_tensorflow_still_holds_the_last_steps() -> None:
    # In a training step TensorFlow still holds a step's results when the next step's crossing runs; with one
    # buffer per slot, every step allocated afresh (8 buffers in 8 steps for the kernel's gradient).
    printed = counting_crossing_buffers("""
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024), keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(learning_rate=0.01)
data = tf.ones([8, 784])

@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(data))
    grads = [hvd.allreduce(g) for g in tape.gradient(loss, model.trainable_variables)]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

for _ in range(8):
    step()
print(max(s.fresh for s in spares), len(spares))
""")
    fresh, crossings = map(int, printed.split())
    assert crossings == 4 and fresh <= 3, printed
