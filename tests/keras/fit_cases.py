"""Worker script: ``model.fit`` with hora.keras on the backend KERAS_BACKEND names, against one process.

Every rank builds the same data. Rank r fits on its rows of each global
batch with a DistributedOptimizer; a reference model with the same initial
weights (float64) fits every global batch in the same process with a plain
optimizer. Their weights must agree, and be bit-identical on every rank.
Also the callbacks (warm-up as Horovod documents it, metric averages equal
the global mean), ``load_model``, mixed precision with an overflow on one
rank (TensorFlow and JAX backends), and the XLA error (TensorFlow backend).
"""

from __future__ import annotations

import os
import sys
import tempfile

import hora.keras as hvd
import keras
import numpy as np

from tests.worker import run_cases

BATCH = 8  # rows per rank per step
STEPS = 4
BACKEND = keras.backend.backend()


def model(seed: int = 0, dtype: str = "float64") -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(16, activation="tanh", dtype=dtype), keras.layers.Dense(3, dtype=dtype)]
    return keras.Sequential([keras.Input((5,), dtype=dtype), *layers])


def global_batches(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.normal(size=(STEPS * size * BATCH, 5)), rng.normal(size=(STEPS * size * BATCH, 3))


def my_rows(rank: int, size: int) -> np.ndarray:
    """This rank's rows: its slice of each global batch, in order."""
    return np.concatenate([np.arange(s * size * BATCH + rank * BATCH, s * size * BATCH + (rank + 1) * BATCH)
                           for s in range(STEPS)])  # fmt: skip


def same_on_every_rank(net: keras.Model) -> None:
    weights = np.concatenate([np.asarray(v.numpy(), dtype=np.float64).ravel() for v in net.variables])
    for other in hvd.allgather_object(weights):
        np.testing.assert_array_equal(other, weights)


def cases(rank: int, size: int):
    x, y = global_batches(size)
    mine = my_rows(rank, size)

    for name in ("SGD", "Adam"):

        def fit_equals_global_batch(name=name):
            make = getattr(keras.optimizers, name)
            net = model(seed=rank)  # different weights on every rank until the callback broadcasts rank 0's
            net.compile(optimizer=hvd.DistributedOptimizer(make(learning_rate=0.05)), loss="mse")
            callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
            net.fit(x[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
            reference = model(seed=0)
            reference.compile(optimizer=make(learning_rate=0.05), loss="mse")
            reference.set_weights(hvd.broadcast_object(model(seed=rank).get_weights() if rank == 0 else None, 0))
            reference.fit(x, y, batch_size=size * BATCH, epochs=2, shuffle=False, verbose=0)
            same_on_every_rank(net)
            # Keras's torch backend computes in float32 where TensorFlow keeps float64: a batch of 2b rows and
            # two of b then round differently, by ~1e-8 (Adam magnifies it); a wrong average is off by far more.
            rtol, atol = (1e-9, 1e-12) if BACKEND == "tensorflow" else (1e-4, 1e-7)
            for trained, expected in zip(net.get_weights(), reference.get_weights(), strict=True):
                np.testing.assert_allclose(trained, expected, rtol=rtol, atol=atol)

        yield f"{BACKEND}: fit on {size} ranks == 1 rank x {size} batches ({name})", fit_equals_global_batch

    for average in (True, False):

        def accumulated_fit_equals_global_batch(average=average):
            # STEPS micro-batches, an update every 2: Horovod's sum of the 2 (average_aggregated_gradients=False)
            # is SGD at twice the rate on their mean, which is what Keras's own accumulation applies.
            net = model(seed=0)
            optimizer = hvd.DistributedOptimizer(
                keras.optimizers.SGD(0.05), backward_passes_per_step=2, average_aggregated_gradients=average
            )
            net.compile(optimizer=optimizer, loss="mse")
            net.fit(x[mine], y[mine], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
            reference = model(seed=0)
            rate = 0.05 if average else 0.1
            reference.compile(optimizer=keras.optimizers.SGD(rate, gradient_accumulation_steps=2), loss="mse")
            reference.fit(x, y, batch_size=size * BATCH, epochs=2, shuffle=False, verbose=0)
            same_on_every_rank(net)
            assert int(net.optimizer.iterations) == int(reference.optimizer.iterations)
            assert len(net.optimizer.variables) == len(reference.optimizer.variables)
            rtol, atol = (1e-9, 1e-12) if BACKEND == "tensorflow" else (1e-4, 1e-7)
            for trained, expected in zip(net.get_weights(), reference.get_weights(), strict=True):
                np.testing.assert_allclose(trained, expected, rtol=rtol, atol=atol)

        yield (
            f"{BACKEND}: backward_passes_per_step=2 (average_aggregated_gradients={average}) == 1 rank accumulating",
            accumulated_fit_equals_global_batch,
        )

    def sync_batch_norm_fit_equals_global_batch():
        def net_with(normalization: type) -> keras.Model:
            keras.utils.set_random_seed(0)
            layers = [keras.layers.Dense(16, dtype="float64"), normalization(dtype="float64", momentum=0.5)]
            return keras.Sequential(
                [keras.Input((5,), dtype="float64"), *layers, keras.layers.Dense(3, dtype="float64")]
            )

        net, reference = net_with(hvd.SyncBatchNormalization), net_with(keras.layers.BatchNormalization)
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
        reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        reference.fit(x, y, batch_size=size * BATCH, epochs=1, shuffle=False, verbose=0)
        # The statistics agree to 1e-16 on every backend; JAX's and torch's normalisation itself then rounds
        # differently for 8 rows and 16 (~1e-7).
        rtol, atol = (1e-9, 1e-12) if BACKEND == "tensorflow" else (1e-4, 1e-7)
        for trained, expected in zip(net.get_weights(), reference.get_weights(), strict=True):  # moving stats too
            np.testing.assert_allclose(trained, expected, rtol=rtol, atol=atol)
        same_on_every_rank(net)

    yield (
        f"{BACKEND}: SyncBatchNormalization, {size} x {BATCH} rows == 1 x {size * BATCH}",
        (sync_batch_norm_fit_equals_global_batch),
    )

    def callbacks():
        net = model(seed=0)
        initial = 0.01 * size
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(initial)), loss="mse", metrics=["mae"])
        local = {}

        class Record(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                local[epoch] = dict(logs)

        warmup = hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=initial, warmup_epochs=2, momentum_correction=False
        )
        history = net.fit(x[mine], y[mine], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
                          callbacks=[warmup, Record(), hvd.callbacks.MetricAverageCallback()])  # fmt: skip
        every = hvd.allgather_object(local)
        for epoch in range(3):
            for metric in ("loss", "mae"):
                expected = np.mean([ranks[epoch][metric] for ranks in every])
                np.testing.assert_allclose(history.history[metric][epoch], expected, rtol=1e-6)
        # Horovod: initial / size * (e * (size - 1) / warmup + 1) at fractional epoch e (+ one step), then initial.
        rates = history.history["learning_rate"]
        steps = STEPS
        expected = [initial / size * ((epoch + 1 - 1 / steps + 1 / steps) * (size - 1) / 2 + 1) for epoch in (0, 1)]
        np.testing.assert_allclose(rates[:2], expected, rtol=1e-6)
        np.testing.assert_allclose(rates[2], expected[1], rtol=1e-6)  # the last warm-up rate stays

    yield f"{BACKEND}: callbacks", callbacks

    def load_model_restores_the_distributed_optimizer():
        net = model(seed=0)
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        directory = hvd.broadcast_object(tempfile.mkdtemp() if rank == 0 else None, 0)
        path = os.path.join(directory, "model.keras")
        if rank == 0:
            net.save(path)
        hvd.allgather_object(None)  # the file is written before anyone reads it
        loaded = hvd.load_model(path)
        assert type(loaded.optimizer).__name__ == "Adam" and "DistributedOptimizer" in str(
            type(loaded.optimizer).__mro__
        )
        assert int(loaded.optimizer.iterations.numpy()) == STEPS
        loaded.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        same_on_every_rank(loaded)
        plain = keras.models.load_model(path)  # Keras alone restores it undistributed
        assert "DistributedOptimizer" not in str(type(plain.optimizer).__mro__)

    yield f"{BACKEND}: load_model", load_model_restores_the_distributed_optimizer

    def dropout_model_is_broadcast():
        # A Dropout layer's seed generator state is a variable too (uint32 on JAX): it is broadcast as well.
        keras.utils.set_random_seed(rank)
        net = keras.Sequential([keras.Input((5,), dtype="float64"), keras.layers.Dense(8, dtype="float64"),
                                keras.layers.Dropout(0.5), keras.layers.Dense(3, dtype="float64")])  # fmt: skip
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
        callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
        net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
        same_on_every_rank(net)

    yield f"{BACKEND}: a model with Dropout", dropout_model_is_broadcast

    def loss_scaler_outside_is_refused():
        # compile() wraps the optimizer when only the model's policy is mixed: the exchange would sit inside
        # the scaler's finite check. The broadcast callback refuses to start training like that.
        net = model(seed=0)
        net.compile(optimizer=keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD())),
                    loss="mse")  # fmt: skip
        try:
            net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip
        except ValueError as exc:
            assert "LossScaleOptimizer wraps a hora DistributedOptimizer" in str(exc), exc
        else:
            raise AssertionError("a LossScaleOptimizer around a DistributedOptimizer was not refused")

    yield f"{BACKEND}: a loss scaler around the distributed optimizer is refused", loss_scaler_outside_is_refused

    def errors():
        for call, kind, text in [
            (lambda: hvd.DistributedOptimizer("adam"), TypeError, "expects a Keras 3 optimizer"),
            (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=3),
                                              backward_passes_per_step=2), ValueError,
             "backward_passes_per_step=2 and the optimizer's gradient_accumulation_steps=3 disagree"),
            (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0), ValueError,
             "backward_passes_per_step must be a positive integer, got 0"),
            (lambda: hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                              backward_passes_per_step=2), ValueError,
             "backward_passes_per_step > 1 with a LossScaleOptimizer"),
            (lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD())), ValueError,
             "already distributed"),
            (lambda: hvd.broadcast_global_variables(0), RuntimeError, "no global variables"),
        ]:  # fmt: skip
            try:
                call()
            except kind as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"no error for {text!r}")

    yield f"{BACKEND}: errors", errors

    if BACKEND == "torch":
        return

    def mixed_precision_overflow_on_one_rank():
        # The exchange runs before the loss scaler's finite check: an overflow on one rank is everyone's.
        keras.config.set_dtype_policy("mixed_float16")
        try:
            net = model(seed=0, dtype=None)
            optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
            assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            net.compile(optimizer=optimizer, loss="mse")
            ys = y[mine].astype(np.float32).copy()
            if rank == size - 1:
                ys[:BATCH] = 1e4  # the scaled float16 gradients overflow in the first step, on this rank only
            net.fit(x[mine].astype(np.float32), ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            # every rank skipped the overflowing step and halved its scale
            assert float(optimizer.dynamic_scale.numpy()) == optimizer.initial_scale / 2, optimizer.dynamic_scale
            same_on_every_rank(net)
        finally:
            keras.config.set_dtype_policy("float32")

    yield f"{BACKEND}: mixed precision, an overflow on one rank", mixed_precision_overflow_on_one_rank

    if BACKEND != "tensorflow":
        return

    def xla_is_refused():
        from hora.tensorflow import XlaUnsupportedError

        net = model(seed=0)
        net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse", jit_compile=True)
        try:
            net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, verbose=0)
        except XlaUnsupportedError as exc:
            assert "jit_compile=False" in str(exc), exc
        else:
            raise AssertionError("model.fit with jit_compile=True ran a collective")

    yield "tensorflow: jit_compile=True is refused", xla_is_refused

    def auto_jit_compile_resolves_to_false_with_a_warning():
        import warnings

        import tensorflow as tf

        # Keras resolves "auto" to XLA only where there is an accelerator: pretend there is one.
        devices = tf.config.list_physical_devices
        gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
        tf.config.list_physical_devices = lambda *args: [*devices(*args), gpu]
        try:
            plain = model(seed=0)
            plain.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
            assert plain.jit_compile is True  # the pretence works: an undistributed model gets XLA
            net = model(seed=0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                net.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
            assert net.jit_compile is False
            messages = [str(w.message) for w in caught if "jit_compile='auto' resolves to False" in str(w.message)]
            assert len(messages) == 1 and "DistributedOptimizer" in messages[0], [str(w.message) for w in caught]
        finally:
            tf.config.list_physical_devices = devices
        net.fit(x[mine], y[mine], batch_size=BATCH, epochs=1, verbose=0)
        same_on_every_rank(net)

    yield (
        "tensorflow: jit_compile='auto' resolves to False, with one warning",
        auto_jit_compile_resolves_to_false_with_a_warning,
    )


if __name__ == "__main__":
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    elif BACKEND == "torch":
        import torch

        torch.set_num_threads(1)
    else:
        import jax

        jax.config.update("jax_enable_x64", True)  # the float64 models of these cases
    sys.exit(run_cases(cases))
