"""``TorchEstimator``: fit a PyTorch model on a Spark DataFrame with Hora; get a ``TorchModel`` back.

``fit`` is pyspark.ml's template: ``_fit`` checks every Param and column
before anything runs, writes the training (and validation) rows as Parquet
to the store under the run id, trains on ``numProc`` ranks with
``hora.spark.run`` (see :mod:`hora.estimators.torch_training`) and returns a
``TorchModel`` with the trained weights and the per-epoch history.
``TorchModel.transform`` runs the model on the executors over Arrow batches
(a pandas UDF that loads the model once per partition), one output column
per label.
"""

from __future__ import annotations

import copy
import tempfile
import uuid
from typing import Any

from hora.estimators.params import EstimatorParams, ModelParams, camel_case_kwargs, with_accessors
from hora.estimators.persistence import BlobReader, BlobWriter
from hora.estimators.torch_training import TrainingSpec, train_on_rank
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLWritable

__all__ = ["TorchEstimator", "TorchModel"]


@with_accessors
class TorchEstimator(Estimator, EstimatorParams, MLWritable, MLReadable):
    """Trains a ``torch.nn.Module`` on a DataFrame with ``numProc`` Hora ranks (Spark tasks).

    Example::

        estimator = TorchEstimator(numProc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-3),
                                   loss=torch.nn.functional.cross_entropy, featureCols=["features"],
                                   labelCols=["label"], batchSize=64, epochs=5, metrics=["accuracy"],
                                   validation=0.1, store=Store.create("/dbfs/ml/runs"))
        model = estimator.fit(train_df)
        predictions = model.transform(test_df)   # adds "label__output"

    Every Param has a getter and setter; the constructor also takes Horovod's
    snake_case names (``feature_cols=``, ``batch_size=``, ...).
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Sets Params by name (camelCase or Horovod's snake_case)."""
        return self._set(**camel_case_kwargs(self._input_kwargs, self))

    # --- checks ---------------------------------------------------------------------------

    def _checked(self, df: Any) -> dict[str, Any]:
        """Every Param, checked against each other and ``df``; raises ValueError naming what is wrong."""
        import torch
        from hora.spark import check_columns

        p = {
            param.name: self.getOrDefault(param) for param in self.params if self.hasDefault(param) or self.isSet(param)
        }
        if not isinstance(p.get("model"), torch.nn.Module):
            raise ValueError(f"TorchEstimator needs model=, a torch.nn.Module; got {p.get('model')!r}.")
        if not isinstance(p.get("optimizer"), torch.optim.Optimizer):
            raise ValueError(f"TorchEstimator needs optimizer=, a torch.optim.Optimizer; got {p.get('optimizer')!r}.")
        for name in ("featureCols", "labelCols"):
            if not p.get(name):
                raise ValueError(f"TorchEstimator needs {name}=, a non-empty list of column names.")
        losses = p.get("loss")
        losses = list(losses) if isinstance(losses, (list, tuple)) else [losses] * len(p["labelCols"])
        if len(losses) != len(p["labelCols"]) or not all(callable(fn) for fn in losses):
            raise ValueError(
                f"TorchEstimator needs loss=, a function (output, label) -> tensor or one per label column "
                f"({len(p['labelCols'])}); got {p.get('loss')!r}."
            )
        weights = p.get("lossWeights") or [1.0] * len(losses)
        if len(weights) != len(losses):
            raise ValueError(f"lossWeights has {len(weights)} entries for {len(losses)} label columns.")
        columns = [*p["featureCols"], *p["labelCols"]]
        if p.get("sampleWeightCol"):
            columns.append(p["sampleWeightCol"])
        check_columns(df, columns)
        validation = p["validation"]
        if isinstance(validation, str):
            if validation not in df.columns:
                raise ValueError(f"The validation column {validation!r} is not in the DataFrame; its columns are "
                                 f"{sorted(df.columns)}.")  # fmt: skip
            check_columns(df, [validation], "validation column")
        if p["inputShapes"] is not None and len(p["inputShapes"]) != len(p["featureCols"]):
            raise ValueError(
                f"inputShapes has {len(p['inputShapes'])} shapes for {len(p['featureCols'])} feature columns."
            )
        if not df.take(1):
            raise ValueError("The DataFrame to fit is empty.")
        return {**p, "loss": losses, "lossWeights": weights}

    # --- fit ------------------------------------------------------------------------------

    def _fit(self, df: Any) -> TorchModel:
        import hora.spark
        from hora.compression import Compression
        from hora.spark import Store, write_parquet
        from hora.spark.barrier import task_slots

        p = self._checked(df)
        store = p["store"]
        if store is None:
            store = Store.create(tempfile.mkdtemp(prefix="hora-estimator-"))
        elif isinstance(store, str):
            store = Store.create(store)
        run_id = p["runId"] or f"torch-{uuid.uuid4().hex[:12]}"
        columns = [*p["featureCols"], *p["labelCols"]] + ([p["sampleWeightCol"]] if p["sampleWeightCol"] else [])
        validation = p["validation"]
        if isinstance(validation, str):
            train_df = df.where(~df[validation].cast("boolean"))
            val_df = df.where(df[validation].cast("boolean"))
        elif validation > 0:
            train_df, val_df = df.randomSplit([1.0 - validation, validation], seed=p["randomSeed"])
        else:
            train_df, val_df = df, None
        num_proc = p["numProc"] or task_slots(df.sparkSession.sparkContext)
        files = max(2 * num_proc, 4)
        write_parquet(train_df, store, store.train_data_path(run_id), columns, num_files=files)
        val_path = None
        if val_df is not None:
            val_path = store.val_data_path(run_id)
            if write_parquet(val_df, store, val_path, columns, num_files=files) < num_proc:
                val_path = None  # too few validation rows for every rank: no validation
        optimizer = p["optimizer"]
        spec = TrainingSpec(
            model=p["model"], optimizer_class=type(optimizer), optimizer_state=optimizer.state_dict(),
            losses=p["loss"], loss_weights=p["lossWeights"], metrics=p["metrics"], feature_cols=p["featureCols"],
            label_cols=p["labelCols"], sample_weight_col=p["sampleWeightCol"], input_shapes=p["inputShapes"],
            store=store, run_id=run_id, train_path=store.train_data_path(run_id), val_path=val_path,
            batch_size=p["batchSize"], val_batch_size=p["valBatchSize"] or p["batchSize"], epochs=p["epochs"],
            train_steps=p["trainStepsPerEpoch"], val_steps=p["validationStepsPerEpoch"],
            shuffle_buffer_size=p["shuffleBufferSize"], seed=p["randomSeed"],
            compression=p["gradientCompression"] or Compression.none,
            backward_passes_per_step=p["backwardPassesPerStep"], transformation_fn=p["transformationFn"],
            callbacks=p["callbacks"], verbose=p["verbose"],
        )  # fmt: skip
        results = hora.spark.run(train_on_rank, args=(spec,), num_proc=num_proc, spark=df.sparkSession,
                                 verbose=1 if p["verbose"] else 0)  # fmt: skip
        trained = copy.deepcopy(p["model"])
        trained.load_state_dict(results[0]["state_dict"])
        model = TorchModel(model=trained, featureCols=p["featureCols"], labelCols=p["labelCols"],
                           inputShapes=p["inputShapes"])  # fmt: skip
        if self.isSet(self.outputCols):
            model.setOutputCols(self.getOrDefault(self.outputCols))
        model.history = results[0]["history"]
        model.output_sizes = results[0]["output_sizes"]
        model.run_id = run_id
        return model

    # --- persistence ----------------------------------------------------------------------

    def write(self) -> BlobWriter:
        return BlobWriter(self)

    @classmethod
    def read(cls) -> BlobReader:
        return BlobReader(cls)


@with_accessors
class TorchModel(Model, ModelParams, MLWritable, MLReadable):
    """A trained model that adds one prediction column per label to a DataFrame.

    Attributes:
        history: one dict per epoch (``loss``, ``val_loss``, metrics) from training.
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.history: list[dict[str, float]] = []
        self.run_id: str | None = None
        self.output_sizes: list[int] | None = None  # values per row of each output, known after training
        self._set(**camel_case_kwargs(self._input_kwargs, self))

    def getHistoryDataFrame(self, spark: Any = None) -> Any:
        """The per-epoch history as a DataFrame (one row per epoch)."""
        from pyspark.sql import SparkSession

        session = spark or SparkSession.getActiveSession()
        return session.createDataFrame([{k: float(v) for k, v in row.items()} for row in self.history])

    def _transform(self, df: Any) -> Any:
        from hora.estimators.prediction import predict_columns

        return predict_columns(self, df)

    def write(self) -> BlobWriter:
        return BlobWriter(self, state=lambda m: {"history": m.history, "run_id": m.run_id, "sizes": m.output_sizes})

    @classmethod
    def read(cls) -> BlobReader:
        return BlobReader(cls, restore=_restore_model_state)


def _restore_model_state(model: TorchModel, state: dict[str, Any]) -> None:
    model.history, model.run_id, model.output_sizes = state["history"], state["run_id"], state["sizes"]
