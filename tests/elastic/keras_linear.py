"""The elastic linear job of tests/elastic/linear.py with Keras 3 (KERAS_BACKEND picks the backend).

``train_on_batch`` runs the compiled step (a ``tf.function`` on TensorFlow,
``jit`` on JAX), so a lost peer reaches :func:`hora.elastic.run` as the
framework's own error. KerasState holds the weights and the optimizer;
``epoch``, ``step`` and ``processed`` (samples of the epoch the job has
processed) are its attributes, playing ElasticSampler's part.

Environment: ELASTIC_OUT, ELASTIC_KILL_HOST, ELASTIC_KILL_STEP as in linear.py.
"""

from __future__ import annotations

import json
import os
import random
import signal

import numpy as np

from tests.elastic.linear import COMMIT_EVERY, EPOCHS, FEATURES, GLOBAL_BATCH, LR, SAMPLES, data


def main() -> None:
    import hora.keras as hvd
    import keras

    hvd.init()
    x, y = (a.astype(np.float32) for a in data())
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    model = keras.Sequential([keras.Input((FEATURES,)), dense])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR)), loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, step=0, processed=0, sizes=[])
    host = os.environ.get("HORA_HOSTNAME", "")

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> None:
        if not state.sizes or state.sizes[-1] != hvd.size():
            state.sizes = [*state.sizes, hvd.size()]
        while state.epoch < EPOCHS:
            order = list(range(SAMPLES))
            random.Random(state.epoch).shuffle(order)
            mine = order[state.processed :][hvd.rank() :: hvd.size()]
            per_rank = GLOBAL_BATCH // hvd.size()
            for start in range(0, len(mine), per_rank):
                if host == os.environ.get("ELASTIC_KILL_HOST") and state.step == int(os.environ["ELASTIC_KILL_STEP"]):
                    os.kill(os.getpid(), signal.SIGKILL)
                batch = mine[start : start + per_rank]
                model.train_on_batch(x[batch], y[batch])
                state.processed += GLOBAL_BATCH
                state.step += 1
                if state.step % COMMIT_EVERY == 0:
                    state.commit()
            state.epoch, state.processed = state.epoch + 1, 0
            state.commit()

    train(state)
    if hvd.rank() == 0 and os.environ.get("ELASTIC_OUT"):
        with open(os.environ["ELASTIC_OUT"], "w") as out:
            weights = dense.kernel.numpy()[:, 0]
            json.dump({"weights": weights.tolist(), "sizes": state.sizes, "steps": state.step}, out)


if __name__ == "__main__":
    main()
