"""``KerasEstimator``: fit a Keras 3 model on a Spark DataFrame with Hora; get a ``KerasModel`` back.

The fit is :class:`hora.estimators.base.HoraEstimator`'s; each rank runs
:func:`hora.estimators.keras_training.train_on_rank`, which is Keras's own
``model.fit`` with :class:`hora.keras.DistributedOptimizer`, on the Keras
backend the driver uses (TensorFlow, JAX or torch). ``KerasModel.transform``
runs ``predict_on_batch`` on the executors over Arrow batches.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from hora.estimators.base import HoraEstimator, HoraModel
from hora.estimators.keras_training import (
    KerasSpec,
    dump_keras_objects,
    dump_saved,
    keras_saving,
    keras_with_backend,
    load_keras_objects,
    load_saved,
    train_on_rank,
)
from hora.estimators.params import HasCustomObjects, with_accessors
from hora.estimators.training import RunSpec

__all__ = ["KerasEstimator", "KerasModel"]


def _keras() -> Any:
    try:
        import keras
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "KerasEstimator needs keras: pip install 'hora[tensorflow]' (or keras with jax/torch)."
        ) from exc
    return keras


def _public(text: str) -> str:
    """A version without its local part (``2.13.0+cpu`` -> ``2.13.0``), as package indexes know it."""
    return text.split("+", 1)[0]


def _copy(keras: Any, value: Any, custom_objects: dict[str, Any]) -> Any:
    """A copy of a Keras object as the ranks will see it (Keras's pickling: the model's own saving format)."""
    with keras.saving.custom_object_scope(custom_objects):
        return pickle.loads(dump_keras_objects(value))


@with_accessors
class KerasEstimator(HoraEstimator, HasCustomObjects):
    """Trains a ``keras.Model`` on a DataFrame with ``numProc`` Hora ranks (Spark tasks), with Keras's ``fit``.

    Example::

        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        estimator = KerasEstimator(numProc=2, model=model, optimizer=keras.optimizers.Adam(1e-3),
                                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                   metrics=["accuracy"], featureCols=["features"], labelCols=["label"],
                                   batchSize=64, epochs=5, validation=0.1)
        fitted = estimator.fit(train_df)
        predictions = fitted.transform(test_df)   # adds "label__output"

    The model must be built (give it an ``Input``). ``optimizer`` is a Keras
    optimizer (or its name), wrapped in :class:`hora.keras.DistributedOptimizer`
    on every rank with its learning rate multiplied by ``numProc``, as
    Horovod's KerasEstimator does (``backwardPassesPerStep`` > 1 applies the
    mean of the accumulated gradients, as ``TorchEstimator``); ``loss``, ``lossWeights`` and ``metrics`` are what
    ``model.compile`` takes; ``callbacks`` are Keras callbacks, run on every
    rank after the logs are averaged over ranks and rank 0's checkpoint is
    written; ``customObjects`` are what the model's custom layers, losses
    or metrics need to load. Every Param has a getter and setter; the
    constructor also takes Horovod's snake_case names (``custom_objects=``).
    """

    framework = "keras"
    _dumps = staticmethod(dump_saved)
    _loads = staticmethod(load_saved)

    def _check_framework(self, p: dict[str, Any]) -> dict[str, Any]:
        keras = _keras()
        model = p.get("model")
        if not isinstance(model, keras.Model):
            raise ValueError(f"KerasEstimator needs model=, a keras.Model; got {model!r}.")
        if not model.built:
            raise ValueError(
                f"KerasEstimator needs a built model, so every rank starts from its weights; {model.name!r} is not "
                "built: give it an input (keras.Input(shape=...)) or call model.build(input_shape) first."
            )
        optimizer = p.get("optimizer")
        if isinstance(optimizer, str):
            optimizer = keras.optimizers.get(optimizer)
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(f"KerasEstimator needs optimizer=, a Keras optimizer or its name; got {optimizer!r}.")
        loss = p.get("loss")
        if loss is None or (isinstance(loss, (list, tuple)) and len(loss) != len(p["labelCols"])):
            raise ValueError(
                f"KerasEstimator needs loss=, a Keras loss (a name, function or keras.losses.Loss) or one per label "
                f"column ({len(p['labelCols'])}); got {loss!r}."
            )
        custom = p.get("customObjects") or {}
        if not isinstance(custom, dict):
            raise ValueError(f"customObjects must be a dict of name -> class or function; got {custom!r}.")
        return {**p, "optimizer": optimizer, "customObjects": custom}

    def _train_fn(self) -> Callable[[KerasSpec], Any]:
        return train_on_rank

    def _spec(self, p: dict[str, Any], run: RunSpec) -> KerasSpec:
        from hora.compression import Compression

        keras = _keras()
        objects = {
            "model": p["model"], "optimizer": p["optimizer"], "loss": p["loss"], "loss_weights": p["lossWeights"],
            "metrics": p["metrics"], "callbacks": p["callbacks"],
        }  # fmt: skip
        return KerasSpec(
            run=run, backend=keras.backend.backend(), custom_objects=dump_keras_objects(p["customObjects"]),
            objects=dump_keras_objects(objects), compression=p["gradientCompression"] or Compression.none,
            backward_passes_per_step=p["backwardPassesPerStep"],
        )  # fmt: skip

    def _log_model(self, model: HoraModel, signature: Any) -> None:
        import mlflow.keras

        keras = _keras()
        packages = {"tensorflow": ("tensorflow", "tensorflow-cpu"), "jax": ("jax",), "torch": ("torch",)}
        requirements = [f"keras=={_public(keras.__version__)}"]
        for package in packages.get(keras.backend.backend(), ()):
            try:
                requirements.append(f"{package}=={_public(version(package))}")
                break
            except PackageNotFoundError:
                continue
        with keras_saving():
            mlflow.keras.log_model(model.getModel(), name="model", pip_requirements=requirements, signature=signature)

    def _trained_model(self, p: dict[str, Any], result: dict[str, Any]) -> KerasModel:
        keras = _keras()
        custom = p["customObjects"]
        trained = _copy(keras, p["model"], custom)
        trained.set_weights(result["weights"])
        optimizer = type(p["optimizer"]).from_config(result["optimizer_config"])
        trained.compile(optimizer=optimizer, loss=p["loss"], loss_weights=p["lossWeights"],
                        metrics=p["metrics"] or None)  # fmt: skip
        optimizer.build(trained.trainable_variables)
        for variable, value in zip(optimizer.variables, result["optimizer"], strict=True):
            variable.assign(value)
        return KerasModel(model=trained, featureCols=p["featureCols"], labelCols=p["labelCols"],
                          inputShapes=p["inputShapes"], customObjects=custom)  # fmt: skip


@with_accessors
class KerasModel(HoraModel, HasCustomObjects):
    """A trained ``keras.Model`` that adds one prediction column per label to a DataFrame.

    The model is compiled with the estimator's loss and metrics and its
    optimizer (not distributed) in its trained state, so it can go on
    training or evaluate where it is.

    Attributes:
        history: one dict per epoch (``loss``, ``val_loss``, metrics) from training, averaged over every rank's rows.
    """

    _dumps = staticmethod(dump_saved)
    _loads = staticmethod(load_saved)

    def _predictor(self) -> KerasPredictor:
        return KerasPredictor(self.getModel(), self.getCustomObjects())


class KerasPredictor:
    """A Keras model on the executors, on the driver's backend: ``predict_on_batch`` per Arrow batch."""

    def __init__(self, model: Any, custom_objects: dict[str, Any]) -> None:
        keras = _keras()
        self.backend = keras.backend.backend()
        self.float_dtype = np.dtype(keras.backend.standardize_dtype(model.dtype))
        self.custom_objects = dump_keras_objects(custom_objects)
        self.model = dump_keras_objects(model)

    def load(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        keras = keras_with_backend(self.backend)
        model = load_keras_objects(keras, self.custom_objects, self.model)

        def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
            result = model.predict_on_batch(arrays[0] if len(arrays) == 1 else arrays)
            if isinstance(result, dict):
                result = [result[name] for name in model.output_names]
            return [np.asarray(out) for out in (result if isinstance(result, (list, tuple)) else [result])]

        return run
