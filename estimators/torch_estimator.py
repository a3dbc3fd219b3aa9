"""``TorchEstimator``: fit a PyTorch model on a Spark DataFrame with Hora; get a ``TorchModel`` back.

The fit is :class:`hora.estimators.base.HoraEstimator`'s; each rank runs
:func:`hora.estimators.torch_training.train_on_rank`. ``TorchModel.transform``
runs the model on the executors over Arrow batches (a pandas UDF that loads
the model once per partition), one output column per label.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
from hora.estimators.base import HoraEstimator, HoraModel
from hora.estimators.params import with_accessors
from hora.estimators.torch_training import TorchSpec, train_on_rank
from hora.estimators.training import RunSpec

__all__ = ["TorchEstimator", "TorchModel"]


@with_accessors
class TorchEstimator(HoraEstimator):
    """Trains a ``torch.nn.Module`` on a DataFrame with ``numProc`` Hora ranks (Spark tasks).

    Example::

        estimator = TorchEstimator(numProc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-3),
                                   loss=torch.nn.functional.cross_entropy, featureCols=["features"],
                                   labelCols=["label"], batchSize=64, epochs=5, metrics=["accuracy"],
                                   validation=0.1, store=Store.create("/dbfs/ml/runs"))
        model = estimator.fit(train_df)
        predictions = model.transform(test_df)   # adds "label__output"

    ``callbacks`` are objects whose ``on_epoch_end(epoch, metrics)`` runs on
    rank 0 after each epoch's checkpoint. Every Param has a getter and
    setter; the constructor also takes Horovod's snake_case names
    (``feature_cols=``, ``batch_size=``, ...).
    """

    framework = "torch"

    def _check_framework(self, p: dict[str, Any]) -> dict[str, Any]:
        import torch

        if not isinstance(p.get("model"), torch.nn.Module):
            raise ValueError(f"TorchEstimator needs model=, a torch.nn.Module; got {p.get('model')!r}.")
        if not isinstance(p.get("optimizer"), torch.optim.Optimizer):
            raise ValueError(f"TorchEstimator needs optimizer=, a torch.optim.Optimizer; got {p.get('optimizer')!r}.")
        losses = p.get("loss")
        losses = list(losses) if isinstance(losses, (list, tuple)) else [losses] * len(p["labelCols"])
        if len(losses) != len(p["labelCols"]) or not all(callable(fn) for fn in losses):
            raise ValueError(
                f"TorchEstimator needs loss=, a function (output, label) -> tensor or one per label column "
                f"({len(p['labelCols'])}); got {p.get('loss')!r}."
            )
        return {**p, "loss": losses}

    def _train_fn(self) -> Callable[[TorchSpec], Any]:
        return train_on_rank

    def _spec(self, p: dict[str, Any], run: RunSpec) -> TorchSpec:
        from hora.compression import Compression

        optimizer = p["optimizer"]
        return TorchSpec(
            run=run, model=p["model"], optimizer_class=type(optimizer), optimizer_state=optimizer.state_dict(),
            losses=p["loss"], loss_weights=p["lossWeights"] or [1.0] * len(p["loss"]), metrics=p["metrics"],
            compression=p["gradientCompression"] or Compression.none,
            backward_passes_per_step=p["backwardPassesPerStep"], callbacks=p["callbacks"],
        )  # fmt: skip

    def _log_model(self, model: HoraModel, signature: Any) -> None:
        import mlflow.pytorch
        import torch

        requirements = [f"torch=={torch.__version__.split('+')[0]}", "cloudpickle"]  # no local version (+cpu)
        mlflow.pytorch.log_model(model.getModel(), name="model", serialization_format="pickle", signature=signature,
                                 pip_requirements=requirements)  # fmt: skip

    def _trained_model(self, p: dict[str, Any], result: dict[str, Any]) -> TorchModel:
        trained = copy.deepcopy(p["model"])
        trained.load_state_dict(result["state_dict"])
        return TorchModel(model=trained, featureCols=p["featureCols"], labelCols=p["labelCols"],
                          inputShapes=p["inputShapes"])  # fmt: skip


@with_accessors
class TorchModel(HoraModel):
    """A trained ``torch.nn.Module`` that adds one prediction column per label to a DataFrame.

    Attributes:
        history: one dict per epoch (``loss``, ``val_loss``, metrics) from training.
    """

    def _predictor(self) -> TorchPredictor:
        return TorchPredictor(self.getModel())


class TorchPredictor:
    """A torch module on the executors: inputs as tensors, one thread per Python worker, no gradients."""

    def __init__(self, net: Any) -> None:
        import torch

        dtype = next((p.dtype for p in net.parameters() if p.is_floating_point()), torch.float32)
        self.float_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        self.blob = cloudpickle.dumps(net)

    def load(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        import torch
        from pyspark import TaskContext

        net = cloudpickle.loads(self.blob)
        net.eval()
        if TaskContext.get() is not None:  # in a Spark task: one thread per Python worker
            torch.set_num_threads(1)

        def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
            with torch.no_grad():
                result = net(*[torch.from_numpy(a) for a in arrays])
            outputs = list(result) if isinstance(result, (list, tuple)) else [result]
            return [out.detach().double().numpy() for out in outputs]

        return run
