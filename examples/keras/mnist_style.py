"""Horovod's Keras script, unchanged but for the import, on scikit-learn's bundled digits (no download).

    horarun -np 2 python examples/keras/mnist_style.py
    KERAS_BACKEND=jax horarun -np 2 python examples/keras/mnist_style.py
    KERAS_BACKEND=torch horarun -np 2 python examples/keras/mnist_style.py

The 8x8 digits are padded to 784 features so the model is the one of the
usual MNIST script. Each rank fits on its shard; ``DistributedOptimizer``
averages the gradients inside ``model.fit``, the callbacks broadcast rank
0's initial weights and average the metrics. Rank 0 prints the test
accuracy, and whether every rank ended with identical weights.
"""

from __future__ import annotations

import argparse

import hora.keras as hvd
import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def digits_as_mnist(seed: int) -> tuple[np.ndarray, ...]:
    digits = load_digits()
    x = np.zeros((len(digits.data), 784), dtype=np.float32)
    x[:, :64] = digits.data / 16.0
    y = keras.utils.to_categorical(digits.target, 10)
    return tuple(train_test_split(x, y, test_size=0.25, random_state=seed, stratify=digits.target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())  # different on purpose: the callback broadcasts rank 0's
    x_train, x_test, y_train, y_test = digits_as_mnist(args.seed)

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    opt = keras.optimizers.Adam(learning_rate=0.001 * hvd.size())
    opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss=keras.losses.CategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.001 * hvd.size(), warmup_epochs=3, verbose=1),
    ]
    shard = slice(hvd.rank(), None, hvd.size())
    model.fit(x_train[shard], y_train[shard], batch_size=32, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)  # fmt: skip

    correct = np.argmax(model.predict(x_test, verbose=0), 1) == np.argmax(y_test, 1)
    weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
    identical = all(np.array_equal(w, weights) for w in hvd.allgather_object(weights))
    if hvd.rank() == 0:
        print(f"test accuracy {correct.mean():.4f} on {len(correct)} images", flush=True)
        print(f"weights {'identical' if identical else 'DIFFERENT'} on {hvd.size()} ranks", flush=True)


if __name__ == "__main__":
    main()
