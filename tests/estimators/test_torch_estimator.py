"""TorchEstimator and TorchModel on local Spark: known answers, validation, resume, persistence, Pipelines, errors."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch
from hora.estimators import TorchEstimator, TorchModel
from hora.exceptions import HoraError
from hora.spark import Store

pytestmark = pytest.mark.timeout(300)


def linear_estimator(tmp_path, **overrides) -> TorchEstimator:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1).double()
    options = dict(
        num_proc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss=torch.nn.functional.mse_loss,
        feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=4, shuffle_buffer_size=0,
        store=Store.create(str(tmp_path)), verbose=0,
    )  # fmt: skip
    options.update(overrides)
    return TorchEstimator(**options)


def test_recovers_a_linear_models_weights_and_predicts(spark, linear, tmp_path) -> None:
    model = linear_estimator(tmp_path, validation=0.2, metrics=["mae"]).fit(linear)
    net = model.getModel()
    np.testing.assert_allclose(net.weight.detach().numpy(), [[1.5, -2.0, 0.5]], atol=1e-4)
    np.testing.assert_allclose(net.bias.detach().numpy(), [0.25], atol=1e-4)
    assert [h["epoch"] for h in model.history] == [1.0, 2.0, 3.0, 4.0]
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(model.history[-1])
    assert model.history[-1]["loss"] < 1e-6 < model.history[0]["loss"]
    rows = model.transform(linear).select("y", "y__output").toPandas()
    np.testing.assert_allclose(rows["y__output"], rows["y"], atol=1e-3)
    history = model.getHistoryDataFrame(spark).orderBy("epoch").collect()
    assert [r["epoch"] for r in history] == [1.0, 2.0, 3.0, 4.0]


def test_classifies_digits_above_90_percent(spark, tmp_path) -> None:
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import load_digits

    digits = load_digits()
    pairs = enumerate(zip(digits.data, digits.target, strict=True))
    rows = [(Vectors.dense(x / 16.0), int(y), i % 5 == 0) for i, (x, y) in pairs]
    frame = spark.createDataFrame(rows, ["pixels", "digit", "test"])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    estimator = TorchEstimator(
        numProc=2, model=net, optimizer=torch.optim.Adam(net.parameters(), lr=0.005),
        loss=torch.nn.functional.cross_entropy, metrics=["accuracy"], featureCols=["pixels"], labelCols=["digit"],
        validation="test", batchSize=32, epochs=6, store=str(tmp_path), verbose=0,
    )  # fmt: skip
    model = estimator.fit(frame)
    assert model.history[-1]["val_accuracy"] > 0.9, model.history
    scored = model.transform(frame.where("test")).select("digit", "digit__output").toPandas()
    accuracy = (np.stack(scored["digit__output"]).argmax(axis=1) == scored["digit"]).mean()
    assert accuracy > 0.9 and len(scored) == 360


class StopAfter:
    """A callback that fails the fit after ``epoch`` (an interruption) and records the epochs it saw."""

    def __init__(self, epoch: int | None, log: str) -> None:
        self.epoch, self.log = epoch, log

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:
        with open(self.log, "a") as f:
            f.write(f"{epoch}\n")
        if epoch == self.epoch:
            raise RuntimeError(f"interrupted after epoch {epoch}")


def test_fitting_again_with_the_run_id_resumes_from_the_last_checkpoint(spark, linear, tmp_path) -> None:
    log = tmp_path / "epochs.txt"
    interrupted = linear_estimator(tmp_path, run_id="resume", epochs=4, callbacks=[StopAfter(2, str(log))])
    with pytest.raises(HoraError, match="interrupted after epoch 2"):
        interrupted.fit(linear)
    store = Store.create(str(tmp_path))
    assert store.listdir(store.checkpoint_path("resume")) == ["epoch-00001.pt", "epoch-00002.pt"]
    model = linear_estimator(tmp_path, run_id="resume", epochs=4, callbacks=[StopAfter(None, str(log))]).fit(linear)
    assert log.read_text().split() == ["1", "2", "3", "4"]  # epochs 3 and 4 only, the second time
    assert [h["epoch"] for h in model.history] == [1.0, 2.0, 3.0, 4.0]
    assert store.listdir(store.checkpoint_path("resume"))[-1] == "epoch-00004.pt"


def test_save_and_load_give_identical_predictions(spark, linear, tmp_path) -> None:
    estimator = linear_estimator(tmp_path, epochs=1, outputCols=["prediction"])
    model = estimator.fit(linear)
    model.write().overwrite().save(str(tmp_path / "model"))
    loaded = TorchModel.load(str(tmp_path / "model"))
    assert loaded.history == model.history and loaded.uid == model.uid
    before = model.transform(linear).select("prediction").toPandas()
    after = loaded.transform(linear).select("prediction").toPandas()
    np.testing.assert_array_equal(before["prediction"], after["prediction"])
    estimator.write().overwrite().save(str(tmp_path / "estimator"))
    again = TorchEstimator.load(str(tmp_path / "estimator"))
    assert again.getBatchSize() == 32 and again.getFeatureCols() == ["features"] and again.uid == estimator.uid
    assert isinstance(again.getOptimizer(), torch.optim.SGD)
    assert again.getOptimizer().param_groups[0]["params"][0] is next(again.getModel().parameters())


def test_pipeline_with_a_vector_assembler_fits_saves_loads_and_transforms(spark, linear, tmp_path) -> None:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    frame = linear.selectExpr("features", "y", "a", "a * 2 as b")
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1).double()
    estimator = linear_estimator(tmp_path, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
                                 feature_cols=["ab"], label_cols=["y"], epochs=1)  # fmt: skip
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="ab"), estimator])
    fitted = pipeline.fit(frame)
    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(loaded.stages[1], TorchModel)
    np.testing.assert_array_equal(
        fitted.transform(frame).select("y__output").toPandas()["y__output"],
        loaded.transform(frame).select("y__output").toPandas()["y__output"],
    )


# pyspark's CrossValidator leaves its ThreadPool open; collected here, its ResourceWarning is not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning", "ignore::ResourceWarning")
def test_cross_validator_over_a_param_grid(spark, linear, tmp_path) -> None:
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    estimator = linear_estimator(tmp_path, epochs=1, output_cols=["prediction"])
    grid = ParamGridBuilder().addGrid(estimator.batchSize, [16, 400]).build()
    validator = CrossValidator(estimator=estimator, estimatorParamMaps=grid, numFolds=2, seed=1,
                               evaluator=RegressionEvaluator(labelCol="y", predictionCol="prediction"))  # fmt: skip
    fitted = validator.fit(linear.limit(400))
    assert len(fitted.avgMetrics) == 2
    assert fitted.avgMetrics[0] < fitted.avgMetrics[1]  # more steps per epoch fit better
    assert isinstance(fitted.bestModel, TorchModel)
    del validator, fitted
    gc.collect()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"feature_cols": ["nope"]}, r"The column 'nope' is not in the DataFrame; its columns are \['a', 'features'"),
        ({"feature_cols": ["name"]}, r"The column 'name' has type string; expected a number"),
        ({"label_cols": []}, r"needs labelCols=, a non-empty list"),
        ({"validation": "missing"}, r"The validation column 'missing' is not in the DataFrame"),
        ({"loss": None}, r"needs loss=, a function \(output, label\)"),
    ],
)
def test_bad_input_fails_before_training(spark, linear, tmp_path, overrides, message) -> None:
    frame = linear.selectExpr("*", "cast(a as string) as name")
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        linear_estimator(tmp_path, **overrides).fit(frame)
    assert time.monotonic() - started < 10
    assert Store.create(str(tmp_path)).listdir(str(tmp_path / "runs")) == []  # nothing written


def test_empty_dataframe_and_batch_size_zero_are_refused(spark, linear, tmp_path) -> None:
    with pytest.raises(ValueError, match="The DataFrame to fit is empty"):
        linear_estimator(tmp_path).fit(linear.where("y > 1000"))
    with pytest.raises(TypeError, match="expected an integer >= 1, got 0"):
        linear_estimator(tmp_path, batch_size=0)
    with pytest.raises(TypeError, match=r"TorchEstimator has no parameter 'batch_sise'; its parameters are \["):
        TorchEstimator(batch_sise=3)
