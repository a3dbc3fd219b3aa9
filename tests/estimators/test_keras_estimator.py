"""KerasEstimator and KerasModel on local Spark against one Keras process: the same weights and losses, resume,
persistence, Pipelines, CrossValidator, errors; and the example on Keras's JAX and torch backends."""

from __future__ import annotations

import gc
import os
import re
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="needs keras: pip install 'hora[tensorflow]'")

from hora.estimators import KerasEstimator, KerasModel  # noqa: E402 - only once keras is known to be there
from hora.exceptions import HoraError  # noqa: E402
from hora.spark import ShardReader, Store  # noqa: E402

from tests.background import BackgroundRuns, Program  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def linear_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)], name="linear")


def linear_estimator(tmp_path, **overrides) -> KerasEstimator:
    options = dict(
        num_proc=2, model=linear_model(), optimizer=keras.optimizers.SGD(0.05), loss="mse",
        feature_cols=["features"], label_cols=["y"], batch_size=25, epochs=2, shuffle_buffer_size=0,
        validation="is_val", store=Store.create(str(tmp_path)), verbose=0,
    )  # fmt: skip
    options.update(overrides)
    return KerasEstimator(**options)


def shard_batches(store: Store, path: str, epoch: int, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Step by step, both ranks' batches of ``epoch`` concatenated: what one process sees with the doubled batch."""
    readers = [ShardReader(store, path, rank=r, size=2, batch_size=batch_size) for r in range(2)]
    steps = zip(*(reader.numpy_batches(epoch) for reader in readers), strict=True)
    return [
        (np.concatenate([b["features"] for b in pair]).astype("float32"), np.concatenate([b["y"] for b in pair]))
        for pair in steps
    ]


@pytest.mark.parametrize("passes", [1, 2])
def test_two_ranks_train_as_one_process_with_the_doubled_batch(spark, linear, tmp_path, passes) -> None:
    estimator = linear_estimator(tmp_path, metrics=["mae"], backward_passes_per_step=passes)
    initial = estimator.getModel().get_weights()
    fitted = estimator.fit(linear)

    # 1000 training rows: 20 steps of 25 rows on each rank, so the averaged gradient is the 50-row batch's; the
    # learning rate is multiplied by the number of ranks, as Horovod's KerasEstimator does; with 2 passes per
    # step the mean of the two is applied, as Keras's own gradient accumulation does.
    store = Store.create(str(tmp_path))
    reference = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    reference.set_weights(initial)
    accumulation = passes if passes > 1 else None
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=accumulation)
    reference.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    for epoch in range(2):
        batches = shard_batches(store, store.train_data_path(fitted.run_id), epoch, 25)
        assert len(batches) == 20 and all(len(y) == 50 for _, y in batches)
        losses = [reference.train_on_batch(x, y, return_dict=True)["loss"] for x, y in batches]
        np.testing.assert_allclose(fitted.history[epoch]["loss"], np.mean(losses), rtol=1e-5)
    for got, want in zip(fitted.getModel().get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    validation = shard_batches(store, store.val_data_path(fitted.run_id), 0, 100)
    x_val, y_val = (np.concatenate(parts) for parts in zip(*validation, strict=True))
    assert len(y_val) == 200
    evaluated = reference.evaluate(x_val, y_val, batch_size=200, verbose=0, return_dict=True)
    np.testing.assert_allclose(fitted.history[-1]["val_loss"], evaluated["loss"], rtol=1e-4)
    np.testing.assert_allclose(fitted.history[-1]["val_mae"], evaluated["mae"], rtol=1e-4)
    assert [h["epoch"] for h in fitted.history] == [1.0, 2.0]

    # The driver's model carries the trained optimizer, and transform predicts as it does.
    trained_optimizer = fitted.getModel().optimizer
    assert int(trained_optimizer.iterations) == 40 // passes
    assert float(trained_optimizer.learning_rate) == pytest.approx(0.1)
    rows = fitted.transform(linear).select("features", "y__output").toPandas()
    features = np.stack([v.toArray() for v in rows["features"]]).astype("float32")
    np.testing.assert_allclose(rows["y__output"], fitted.getModel().predict(features, verbose=0)[:, 0], rtol=1e-6)


class StopAfter(keras.callbacks.Callback):
    """A Keras callback that records the epochs it saw (rank 0) and fails the fit after ``stop`` (an interruption)."""

    def __init__(self, stop: int | None, log: str) -> None:
        super().__init__()
        self.stop, self.log = stop, log

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        import hora

        if hora.rank() == 0:
            with open(self.log, "a") as f:
                f.write(f"{epoch + 1}\n")
        if epoch + 1 == self.stop:
            raise RuntimeError(f"interrupted after epoch {epoch + 1}")


def test_fitting_again_with_the_run_id_resumes_where_an_uninterrupted_fit_would_be(spark, linear, tmp_path) -> None:
    def estimator(run_id: str, stop: int | None) -> KerasEstimator:
        return linear_estimator(tmp_path, run_id=run_id, epochs=3, optimizer=keras.optimizers.Adam(0.02),
                                shuffle_buffer_size=100, callbacks=[StopAfter(stop, str(log))])  # fmt: skip

    log = tmp_path / "epochs.txt"
    whole = estimator("whole", None).fit(linear)
    log.unlink()
    with pytest.raises(HoraError, match="interrupted after epoch 2"):
        estimator("resumed", 2).fit(linear)
    store = Store.create(str(tmp_path))
    assert store.listdir(store.checkpoint_path("resumed")) == ["epoch-00001.zip", "epoch-00002.zip"]
    resumed = estimator("resumed", None).fit(linear)
    assert log.read_text().split() == ["1", "2", "3"]  # epoch 3 only, the second time
    assert [h["epoch"] for h in resumed.history] == [1.0, 2.0, 3.0]
    for got, want in zip(resumed.history, whole.history, strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    # Adam's moments came back from the checkpoint too: the weights are those of the uninterrupted fit.
    for got, want in zip(resumed.getModel().get_weights(), whole.getModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_save_and_load_give_identical_predictions(spark, linear, tmp_path) -> None:
    estimator = linear_estimator(tmp_path, epochs=1, outputCols=["prediction"])
    fitted = estimator.fit(linear)
    fitted.write().overwrite().save(str(tmp_path / "model"))
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert loaded.history == fitted.history and loaded.uid == fitted.uid and loaded.run_id == fitted.run_id
    before = fitted.transform(linear).select("prediction").toPandas()
    after = loaded.transform(linear).select("prediction").toPandas()
    np.testing.assert_array_equal(before["prediction"], after["prediction"])
    estimator.write().overwrite().save(str(tmp_path / "estimator"))
    again = KerasEstimator.load(str(tmp_path / "estimator"))
    assert again.getBatchSize() == 25 and again.getFeatureCols() == ["features"] and again.uid == estimator.uid
    assert isinstance(again.getOptimizer(), keras.optimizers.SGD)
    for got, want in zip(again.getModel().get_weights(), estimator.getModel().get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


class Affine(keras.layers.Layer):
    """A layer Keras does not know (not registered): only customObjects can load a model holding it."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 1), initializer="zeros")
        self.b = self.add_weight(shape=(1,), initializer="zeros")

    def call(self, x):
        return keras.ops.matmul(x, self.w) + self.b


def test_custom_objects_train_save_and_load(spark, linear, tmp_path) -> None:
    model = keras.Sequential([keras.Input((3,)), Affine()], name="custom")
    estimator = linear_estimator(tmp_path, model=model, epochs=2, custom_objects={"Affine": Affine})
    fitted = estimator.fit(linear)
    assert fitted.history[-1]["loss"] < 0.01 < fitted.history[0]["loss"]
    fitted.write().overwrite().save(str(tmp_path / "model"))
    loaded = KerasModel.load(str(tmp_path / "model"))
    assert isinstance(loaded.getModel().layers[-1], Affine)
    before = fitted.transform(linear).select("y__output").toPandas()["y__output"]
    np.testing.assert_array_equal(loaded.transform(linear).select("y__output").toPandas()["y__output"], before)
    estimator.write().overwrite().save(str(tmp_path / "estimator"))
    assert isinstance(KerasEstimator.load(str(tmp_path / "estimator")).getModel().layers[-1], Affine)


def test_pipeline_with_a_vector_assembler_fits_saves_loads_and_transforms(spark, linear, tmp_path) -> None:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    frame = linear.selectExpr("y", "a", "a * 2 as b", "is_val")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    estimator = linear_estimator(tmp_path, model=model, feature_cols=["ab"], epochs=1)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b"], outputCol="ab"), estimator])
    fitted = pipeline.fit(frame)
    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(loaded.stages[1], KerasModel)
    np.testing.assert_array_equal(
        fitted.transform(frame).select("y__output").toPandas()["y__output"],
        loaded.transform(frame).select("y__output").toPandas()["y__output"],
    )


# pyspark's CrossValidator leaves its ThreadPool open; collected here, its ResourceWarning is not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning", "ignore::ResourceWarning")
def test_cross_validator_over_a_param_grid(spark, linear, tmp_path) -> None:
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    estimator = linear_estimator(tmp_path, epochs=1, validation=0.0, output_cols=["prediction"])
    grid = ParamGridBuilder().addGrid(estimator.batchSize, [8, 200]).build()
    validator = CrossValidator(estimator=estimator, estimatorParamMaps=grid, numFolds=2, seed=1,
                               evaluator=RegressionEvaluator(labelCol="y", predictionCol="prediction"))  # fmt: skip
    fitted = validator.fit(linear.limit(400))
    assert len(fitted.avgMetrics) == 2
    assert fitted.avgMetrics[0] < fitted.avgMetrics[1]  # more steps per epoch fit better
    assert isinstance(fitted.bestModel, KerasModel)
    del validator, fitted
    gc.collect()


UNBUILT = keras.Sequential([keras.layers.Dense(1)], name="unbuilt")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "linear"}, r"KerasEstimator needs model=, a keras.Model; got 'linear'"),
        ({"model": UNBUILT}, r"needs a built model, so every rank starts from its weights; 'unbuilt' is not built"),
        ({"optimizer": 0.1}, r"needs optimizer=, a Keras optimizer or its name; got 0.1"),
        ({"loss": None}, r"needs loss=, a Keras loss \(a name, function or keras.losses.Loss\) or one per label"),
        ({"loss": ["mse", "mae"]}, r"or one per label column \(1\); got \['mse', 'mae'\]"),
        ({"custom_objects": ["Dense"]}, r"customObjects must be a dict of name -> class or function; got \['Dense'\]"),
        ({"label_cols": ["nope"]}, r"The column 'nope' is not in the DataFrame"),
        ({"loss_weights": [1.0, 2.0]}, r"lossWeights has 2 entries for 1 label columns"),
    ],
)
def test_bad_input_fails_before_training(spark, linear, tmp_path, overrides, message) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        linear_estimator(tmp_path, **overrides).fit(linear)
    assert time.monotonic() - started < 10
    assert Store.create(str(tmp_path)).listdir(str(tmp_path / "runs")) == []  # nothing written


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRuns]:
    """The example on the jax and the torch backends, both at once (most of each run is start-up)."""
    argv = [sys.executable, "examples/spark/keras_estimator.py", "--epochs", "6"]
    programs = {
        backend: Program(argv, ROOT, dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"), timeout=220)
        for backend in ("jax", "torch")
    }
    runs = BackgroundRuns(programs, tmp_path_factory.mktemp("example-output"), parallel=2)
    yield runs
    runs.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_example_trains_on_the_drivers_keras_backend(backend: str, example_runs: BackgroundRuns) -> None:
    result = example_runs.result(backend)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"Keras backend {backend}," in result.stdout
    accuracy = float(re.search(r"test accuracy ([\d.]+) on 360 held-out rows", result.stdout).group(1))
    assert accuracy >= 0.9, result.stdout[-2000:]
