"""The training each rank runs for ``KerasEstimator.fit`` (under ``hora.spark.run``): Keras's own ``model.fit``.

Each rank imports Keras with the backend the driver used (TensorFlow, JAX
or torch), loads the model and the compile arguments, and compiles with
:class:`hora.keras.DistributedOptimizer`, the learning rate multiplied by
the number of ranks as Horovod's KerasEstimator does. Rank 0's state (the latest
checkpoint of the run, if any: weights, optimizer slots, history) is
broadcast to every rank. ``model.fit`` then reads this rank's shard of the
data (see :mod:`hora.estimators.training`) for the remaining epochs, with
the user's callbacks on every rank, as Horovod's KerasEstimator runs them.

Per epoch, Keras's logged means are weighted by each rank's rows and
allreduced, so the history (and every later callback) sees the global
average; rank 0 then writes a checkpoint (``model.save_weights``, which
holds the optimizer's variables too, and the history) before the user's
callbacks run, so an interrupted fit resumes from its last complete epoch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
from hora.estimators.training import (
    Checkpoints,
    Progress,
    RunSpec,
    batch_arrays,
    epoch_batches,
    epoch_rows,
    readers,
)

__all__ = [
    "KerasSpec",
    "dump_keras_objects",
    "dump_saved",
    "keras_saving",
    "keras_with_backend",
    "load_keras_objects",
    "load_saved",
    "train_on_rank",
]

_WEIGHTS = "state.weights.h5"
_HISTORY = "history.json"


@dataclass
class KerasSpec:
    """What a rank needs to train a Keras model, cloudpickled from the driver.

    Keras objects travel as bytes, loaded only once Keras runs on ``backend``.
    """

    run: RunSpec
    backend: str
    custom_objects: bytes  # cloudpickled {name: class or function}
    objects: bytes  # cloudpickled {"model", "optimizer", "loss", "loss_weights", "metrics", "callbacks"}
    compression: Any
    backward_passes_per_step: int


def keras_with_backend(backend: str) -> Any:
    """``keras``, imported on ``backend`` in this process.

    Spark reuses a Python worker for later tasks, so Keras may be loaded on
    another backend already; then Keras and ``hora.keras`` are imported
    afresh, as ``keras.config.set_backend`` does (no Keras object of the
    earlier task outlives it).
    """
    loaded = sys.modules.get("keras")
    if loaded is not None:
        if loaded.backend.backend() == backend:
            return loaded
        stale = [
            n for n in sys.modules if n.split(".")[0] == "keras" or n.startswith(("hora.keras", "hora.tensorflow"))
        ]
        for name in stale:
            del sys.modules[name]
    os.environ["KERAS_BACKEND"] = backend
    import keras

    if keras.backend.backend() != backend:  # pragma: no cover - Keras ignored KERAS_BACKEND
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r} here, not on {backend!r} as the driver does.")
    return keras


@contextlib.contextmanager
def keras_saving() -> Iterator[None]:
    """Around Keras saving a model: TensorFlow's variables predate numpy 2's ``__array__(copy=...)``, so numpy
    warns (DeprecationWarning) each time Keras saves one; the copy it makes is right, and that one warning is
    muted here, nothing else."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="__array__ implementation doesn't accept a copy keyword", category=DeprecationWarning
        )
        yield


def dump_keras_objects(objects: Any) -> bytes:
    """``objects`` cloudpickled; Keras pickles a model in its own saving format."""
    with keras_saving():
        return cloudpickle.dumps(objects)


def dump_saved(blob: dict[str, Any]) -> bytes:
    """A saved estimator's or model's Params and state, its ``customObjects`` pickled apart: loading needs them
    in Keras's scope before the model."""
    custom = blob["params"].get("customObjects") or {}
    return cloudpickle.dumps((dump_keras_objects(custom), dump_keras_objects(blob)))


def load_saved(data: bytes) -> Any:
    """What :func:`dump_saved` wrote."""
    import keras

    custom, rest = cloudpickle.loads(data)
    return load_keras_objects(keras, custom, rest)


def load_keras_objects(keras: Any, custom_objects: bytes, objects: bytes) -> Any:
    """Unpickles ``objects`` with ``custom_objects`` in Keras's scope (a model's layers may need them)."""
    with keras.saving.custom_object_scope(cloudpickle.loads(custom_objects)):
        return cloudpickle.loads(objects)


def _checkpoint(model: Any, history: list[dict[str, float]]) -> bytes:
    """A zip of the model's and optimizer's variables (Keras's weights file) and the history."""
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="hora-keras-") as directory:
        path = os.path.join(directory, _WEIGHTS)
        model.save_weights(path)
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.write(path, _WEIGHTS)
            archive.writestr(_HISTORY, json.dumps(history))
    return buffer.getvalue()


def _restore(model: Any, data: bytes) -> list[dict[str, float]]:
    """Loads a :func:`_checkpoint` into ``model`` (built, with its optimizer built); returns the history."""
    with tempfile.TemporaryDirectory(prefix="hora-keras-") as directory, zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extract(_WEIGHTS, directory)
        model.load_weights(os.path.join(directory, _WEIGHTS))
        return json.loads(archive.read(_HISTORY))


def _xy(batch: dict[str, np.ndarray], run: RunSpec, float_dtype: np.dtype) -> tuple:
    """One batch as ``model.fit`` takes it: ``(x, y)`` or ``(x, y, sample_weight)``."""
    features, labels, weights = batch_arrays(batch, run, float_dtype)
    x = features[0] if len(features) == 1 else tuple(features)
    y = labels[0] if len(labels) == 1 else tuple(labels)
    return (x, y) if weights is None else (x, y, weights)


def _training(reader: Any, steps: int, first_epoch: int, run: RunSpec, float_dtype: np.dtype) -> Iterator[tuple]:
    """The training batches of every epoch from ``first_epoch`` on, as one stream (``fit`` takes ``steps`` a time)."""
    epoch = first_epoch
    while True:
        for batch in epoch_batches(reader, steps, epoch):
            yield _xy(batch, run, float_dtype)
        epoch += 1


def _validation(keras: Any, reader: Any, steps: int, run: RunSpec, float_dtype: np.dtype) -> Any:
    """The validation pass as a ``PyDataset``: Keras asks for batches by index, and starts again at 0 each time
    (a generator would not do: TensorFlow's input pipeline reads ahead, and a new pass would begin mid-way)."""

    class Validation(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__()
            self._batches: Iterator[dict[str, np.ndarray]] | None = None
            self._next = 0

        def __len__(self) -> int:
            return steps

        def __getitem__(self, index: int) -> tuple:
            if self._batches is None or index != self._next:
                self._batches = epoch_batches(reader, steps)
                for _ in range(index):
                    next(self._batches)
            self._next = index + 1
            return _xy(next(self._batches), run, float_dtype)

    return Validation()


def _callbacks(keras: Any, hvd: Any, model: Any, run: RunSpec, data: tuple, checkpoints: Checkpoints,
               history: list[dict[str, float]]) -> list[Any]:  # fmt: skip
    """The estimator's own callbacks: global averages of the logs, then rank 0's checkpoint and report."""
    import hora
    from hora.spark import log_metrics

    train, val, train_steps, val_steps = data
    progress, seen = Progress(run.epochs, train_steps), {"": 0.0}  # rows this epoch, over every rank

    class GlobalAverages(keras.callbacks.Callback):
        """Replaces each rank's logged means by the mean over every rank's rows."""

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            progress.start_epoch()

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if logs is None:
                return
            rows = {"": epoch_rows(train, train_steps, epoch + 1), "val_": epoch_rows(val, val_steps) if val else 0}
            keys = sorted(logs)
            weights = [rows["val_" if k.startswith("val_") else ""] for k in keys]
            sums = np.array([float(logs[k]) * w for k, w in zip(keys, weights, strict=True)] + [*rows.values()])
            total = hora.allreduce(sums, op=hora.Sum, name=f"keras_estimator.logs.{epoch}")
            counts = dict(zip(rows, total[len(keys) :], strict=True))
            seen[""] = float(counts[""])
            for i, key in enumerate(keys):
                logs[key] = float(total[i] / counts["val_" if key.startswith("val_") else ""])

    class Checkpoint(keras.callbacks.Callback):
        """Appends the epoch to the history; rank 0 writes the checkpoint and prints the epoch's line."""

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            logs = logs or {}
            order = sorted(logs, key=lambda k: (k.startswith("val_"), k not in ("loss", "val_loss")))  # as torch's
            record = {"epoch": float(epoch + 1), **{k: float(logs[k]) for k in order}}
            history.append(record)
            if run.tracked:
                log_metrics({k: v for k, v in record.items() if k != "epoch"}, step=epoch + 1)  # rank 0's: MLflow
            if hvd.rank() == 0:
                checkpoints.save(epoch + 1, _checkpoint(model, history))
                if run.verbose >= 1:
                    print(progress.line(epoch + 1, record, seen[""]), flush=True)
            hora.barrier()  # no rank starts the next epoch before the checkpoint is written

    return [GlobalAverages(), Checkpoint()]


def _scaled_learning_rate(optimizer: Any, size: int, callbacks: list[Any], hvd: Any) -> Any:
    """``optimizer`` with its learning rate multiplied by ``size``, as Horovod's KerasEstimator does.

    The user's learning-rate schedule callbacks then start from the scaled
    rate, as there. A ``LearningRateSchedule`` is left as it is (Horovod's
    estimator cannot scale one either).
    """
    config = optimizer.get_config()
    rate = config.get("learning_rate")
    if not isinstance(rate, (int, float)):
        return optimizer
    config["learning_rate"] = rate * size
    for callback in callbacks:
        if isinstance(callback, hvd.callbacks.LearningRateScheduleCallback):
            callback.initial_lr = config["learning_rate"]
    return type(optimizer).from_config(config)


def _output_sizes(model: Any) -> list[int] | None:
    """Values per row of each output when the model declares its outputs (functional and Sequential models)."""
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return None
    return None if not outputs else [int(np.prod(out.shape[1:])) for out in outputs]


def train_on_rank(spec: KerasSpec) -> dict | None:
    """Trains on this rank; rank 0 returns the model's and optimizer's variables and the history, the others None."""
    keras = keras_with_backend(spec.backend)
    import hora.keras as hvd

    hvd.init()
    run = spec.run
    keras.utils.set_random_seed(run.seed)
    objects = load_keras_objects(keras, spec.custom_objects, spec.objects)
    model = objects["model"]
    optimizer = hvd.DistributedOptimizer(
        _scaled_learning_rate(objects["optimizer"], hvd.size(), objects["callbacks"], hvd),
        compression=spec.compression, backward_passes_per_step=spec.backward_passes_per_step,
        average_aggregated_gradients=True,  # as TorchEstimator, which divides each pass's loss by their number
    )  # fmt: skip
    model.compile(optimizer=optimizer, loss=objects["loss"], loss_weights=objects["loss_weights"],
                  metrics=objects["metrics"] or None)  # fmt: skip
    optimizer.build(model.trainable_variables)
    checkpoints = Checkpoints(run.store, run.run_id, ".zip")
    history: list[dict[str, float]] = []
    latest = checkpoints.latest() if hvd.rank() == 0 else None
    if latest is not None:
        history = _restore(model, latest)
    history = hvd.broadcast_object(history, root_rank=0)
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)
    train, val, train_steps, val_steps = readers(run)
    float_dtype = np.dtype(keras.backend.standardize_dtype(model.dtype))
    callbacks = _callbacks(keras, hvd, model, run, (train, val, train_steps, val_steps), checkpoints, history)
    model.fit(
        _training(train, train_steps, len(history) + 1, run, float_dtype),
        steps_per_epoch=train_steps,
        epochs=run.epochs,
        initial_epoch=len(history),
        validation_data=_validation(keras, val, val_steps, run, float_dtype) if val is not None else None,
        validation_steps=val_steps or None,
        callbacks=[*callbacks, *objects["callbacks"]],
        shuffle=False,  # the readers shuffle
        verbose=0,
    )
    if hvd.rank() != 0:
        return None
    return {
        "weights": [np.asarray(w) for w in model.get_weights()],
        "optimizer_config": optimizer.get_config(),  # the scaled learning rate, the accumulation steps
        "optimizer": [np.asarray(v) for v in optimizer.variables],
        "history": history,
        "output_sizes": _output_sizes(model),
    }
