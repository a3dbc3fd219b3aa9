"""What ``TorchEstimator`` and ``KerasEstimator`` (and their models) share: checks, the data, the run, persistence.

``fit`` is pyspark.ml's template. :meth:`HoraEstimator._fit` checks every
Param and column before anything runs (the framework adds its own checks in
``_check_framework``), writes the training (and validation) rows as Parquet
to the store under the run id, runs the framework's ``train_on_rank`` on
``numProc`` ranks with ``hora.spark.run`` and hands rank 0's result to
``_trained_model``. A :class:`HoraModel` adds one prediction column per
label to a DataFrame through the framework's predictor (see
:mod:`hora.estimators.prediction`).
"""

from __future__ import annotations

import tempfile
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle
from hora.estimators.params import EstimatorParams, ModelParams, camel_case_kwargs
from hora.estimators.persistence import BlobReader, BlobWriter
from hora.estimators.training import RunSpec
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLWritable

__all__ = ["HoraEstimator", "HoraModel"]


class HoraEstimator(Estimator, EstimatorParams, MLWritable, MLReadable):
    """A pyspark.ml Estimator that trains on ``numProc`` Hora ranks; subclasses bring the framework."""

    framework = ""  # names runs ("torch-1a2b...") in the store
    _dumps: Callable[[Any], bytes] = staticmethod(cloudpickle.dumps)  # how save() pickles the Params
    _loads: Callable[[bytes], Any] = staticmethod(cloudpickle.loads)  # and load() unpickles them

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> HoraEstimator:
        """Sets Params by name (camelCase or Horovod's snake_case)."""
        return self._set(**camel_case_kwargs(self._input_kwargs, self))

    # --- what a framework supplies ----------------------------------------------------------

    def _check_framework(self, p: dict[str, Any]) -> dict[str, Any]:
        """Checks the framework's Params (model, optimizer, loss ...) in ``p``; returns ``p`` as training needs it."""
        raise NotImplementedError

    def _train_fn(self) -> Callable[[Any], Any]:
        """The function each rank runs with the spec from :meth:`_spec`."""
        raise NotImplementedError

    def _spec(self, p: dict[str, Any], run: RunSpec) -> Any:
        raise NotImplementedError

    def _trained_model(self, p: dict[str, Any], result: dict[str, Any]) -> HoraModel:
        """The fitted model from rank 0's result (``history`` and ``output_sizes`` are set by the caller)."""
        raise NotImplementedError

    # --- checks -----------------------------------------------------------------------------

    def _checked(self, df: Any) -> dict[str, Any]:
        """Every Param, checked against each other and ``df``; raises ValueError naming what is wrong."""
        from hora.spark import check_columns

        name = type(self).__name__
        p = {
            param.name: self.getOrDefault(param) for param in self.params if self.hasDefault(param) or self.isSet(param)
        }
        for cols in ("featureCols", "labelCols"):
            if not p.get(cols):
                raise ValueError(f"{name} needs {cols}=, a non-empty list of column names.")
        p = self._check_framework(p)
        weights = p.get("lossWeights")
        if weights is not None and len(weights) != len(p["labelCols"]):
            raise ValueError(f"lossWeights has {len(weights)} entries for {len(p['labelCols'])} label columns.")
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
        return p

    # --- fit --------------------------------------------------------------------------------

    def _fit(self, df: Any) -> HoraModel:
        import hora.spark
        from hora.estimators.tracking import log_params, mlflow_run, model_signature

        p = self._checked(df)
        with mlflow_run(p["mlflow"]) as tracked:
            run = self._write_data(df, p)
            run.tracked = tracked is not None
            if tracked is not None:  # the Params as set, with what the fit resolved
                given = {param.name: self.getOrDefault(param) for param in self.params if self.isDefined(param)}
                log_params({**given, "numProc": p["numProc"], "runId": run.run_id, "mlflow": None})
            results = hora.spark.run(self._train_fn(), args=(self._spec(p, run),), num_proc=p["numProc"],
                                     spark=df.sparkSession, verbose=1 if p["verbose"] else 0,
                                     mlflow=tracked is not None)  # fmt: skip
            model = self._trained_model(p, results[0])
            if self.isSet(self.outputCols):
                model.setOutputCols(self.getOrDefault(self.outputCols))
            model.history = results[0]["history"]
            model.output_sizes = results[0]["output_sizes"]
            model.run_id = run.run_id
            if tracked is not None:
                try:
                    self._log_model(model, model_signature(model, df))
                except Exception as exc:  # the fit is done: a model MLflow cannot take must not lose it
                    warnings.warn(f"{type(self).__name__}: could not log the model to MLflow: {exc!r}", stacklevel=2)
        return model

    def _log_model(self, model: HoraModel, signature: Any) -> None:
        """Logs the fitted model to the active MLflow run with the framework's flavor, under ``model``."""
        raise NotImplementedError

    def _write_data(self, df: Any, p: dict[str, Any]) -> RunSpec:
        """Writes the training and validation rows to the store; sets ``p["numProc"]``; returns the run."""
        from hora.spark import Store, write_parquet
        from hora.spark.barrier import session_slots

        store = p["store"]
        if store is None:
            store = Store.create(tempfile.mkdtemp(prefix="hora-estimator-"))
        elif isinstance(store, str):
            store = Store.create(store)
        run_id = p["runId"] or f"{self.framework}-{uuid.uuid4().hex[:12]}"
        columns = [*p["featureCols"], *p["labelCols"]] + ([p["sampleWeightCol"]] if p["sampleWeightCol"] else [])
        validation = p["validation"]
        if isinstance(validation, str):
            train_df = df.where(~df[validation].cast("boolean"))
            val_df = df.where(df[validation].cast("boolean"))
        elif validation > 0:
            train_df, val_df = df.randomSplit([1.0 - validation, validation], seed=p["randomSeed"])
        else:
            train_df, val_df = df, None
        p["numProc"] = p["numProc"] or session_slots(df.sparkSession)
        if p["numProc"] is None:
            raise ValueError(
                f"{type(self).__name__}: this Spark Connect session does not tell how many tasks its cluster runs "
                "at once; set numProc."
            )
        files = max(2 * p["numProc"], 4)
        write_parquet(train_df, store, store.train_data_path(run_id), columns, num_files=files)
        val_path = None
        if val_df is not None:
            val_path = store.val_data_path(run_id)
            if write_parquet(val_df, store, val_path, columns, num_files=files) < p["numProc"]:
                val_path = None  # too few validation rows for every rank: no validation
        return RunSpec(
            feature_cols=p["featureCols"], label_cols=p["labelCols"], sample_weight_col=p["sampleWeightCol"],
            input_shapes=p["inputShapes"], store=store, run_id=run_id, train_path=store.train_data_path(run_id),
            val_path=val_path, batch_size=p["batchSize"], val_batch_size=p["valBatchSize"] or p["batchSize"],
            epochs=p["epochs"], train_steps=p["trainStepsPerEpoch"], val_steps=p["validationStepsPerEpoch"],
            shuffle_buffer_size=p["shuffleBufferSize"], seed=p["randomSeed"],
            transformation_fn=p["transformationFn"], verbose=p["verbose"],
        )  # fmt: skip

    # --- persistence ------------------------------------------------------------------------

    def write(self) -> BlobWriter:
        return BlobWriter(self, dumps=self._dumps)

    @classmethod
    def read(cls) -> BlobReader:
        return BlobReader(cls, loads=cls._loads)


class HoraModel(Model, ModelParams, MLWritable, MLReadable):
    """A trained model that adds one prediction column per label to a DataFrame.

    Attributes:
        history: one dict per epoch (``loss``, ``val_loss``, metrics) from training.
        run_id: the run in the store that trained it.
    """

    _dumps: Callable[[Any], bytes] = staticmethod(cloudpickle.dumps)  # how save() pickles the Params and state
    _loads: Callable[[bytes], Any] = staticmethod(cloudpickle.loads)  # and load() unpickles them

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.history: list[dict[str, float]] = []
        self.run_id: str | None = None
        self.output_sizes: list[int] | None = None  # values per row of each output, known after training
        self._set(**camel_case_kwargs(self._input_kwargs, self))

    def _predictor(self) -> Any:
        """A picklable :class:`hora.estimators.prediction.Predictor` for this model."""
        raise NotImplementedError

    def getHistoryDataFrame(self, spark: Any = None) -> Any:
        """The per-epoch history as a DataFrame (one row per epoch)."""
        from pyspark.sql import SparkSession

        session = spark or SparkSession.getActiveSession()
        return session.createDataFrame([{k: float(v) for k, v in row.items()} for row in self.history])

    def _transform(self, df: Any) -> Any:
        from hora.estimators.prediction import predict_columns

        return predict_columns(self, df, self._predictor())

    def write(self) -> BlobWriter:
        state = {"history": self.history, "run_id": self.run_id, "sizes": self.output_sizes}
        return BlobWriter(self, state=lambda _: state, dumps=self._dumps)

    @classmethod
    def read(cls) -> BlobReader:
        return BlobReader(cls, restore=_restore_model_state, loads=cls._loads)


def _restore_model_state(model: HoraModel, state: dict[str, Any]) -> None:
    model.history, model.run_id, model.output_sizes = state["history"], state["run_id"], state["sizes"]
