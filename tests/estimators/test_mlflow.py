"""A fit in a real local MLflow tracking store: Params, rank 0's per-epoch metrics, a loadable model; and
``hora.spark.log_metrics`` from inside ``hora.spark.run``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hora.estimators import TorchEstimator
from hora.exceptions import HoraError

mlflow = pytest.importorskip("mlflow", reason="needs MLflow: pip install 'hora[mlflow]'")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    """A file tracking store of this test's own (MLflow 3 asks to opt in to the file store)."""
    with warnings.catch_warnings():  # MLflow 3.18 warns about its own type hints while mlflow.pyfunc loads
        warnings.simplefilter("ignore", UserWarning)
        import mlflow.pyfunc
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(f"file://{tmp_path}/mlruns")
    yield mlflow.MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def torch_estimator(tmp_path, **overrides) -> TorchEstimator:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1).double()
    options = dict(
        num_proc=2, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss=torch.nn.functional.mse_loss,
        feature_cols=["features"], label_cols=["y"], batch_size=32, epochs=3, validation="is_val", metrics=["mae"],
        store=str(tmp_path / "store"), verbose=0,
    )  # fmt: skip
    options.update(overrides)
    return TorchEstimator(**options)


def test_a_fit_logs_params_per_epoch_metrics_and_a_loadable_model(spark, linear, tmp_path, tracking) -> None:
    fitted = torch_estimator(tmp_path, mlflow=True).fit(linear)  # no run was active: the fit starts one
    assert mlflow.active_run() is None  # and ends it
    (run,) = tracking.search_runs([tracking.get_experiment_by_name("Default").experiment_id])
    params = run.data.params
    assert params["batchSize"] == "32" and params["featureCols"] == '["features"]' and params["epochs"] == "3"
    assert params["runId"] == fitted.run_id and params["loss"] == "mse_loss"
    for name in ("loss", "mae", "val_loss", "val_mae"):
        logged = tracking.get_metric_history(run.info.run_id, name)
        assert [m.step for m in sorted(logged, key=lambda m: m.step)] == [1, 2, 3], name
        expected = [h[name] for h in fitted.history]
        assert [m.value for m in sorted(logged, key=lambda m: m.step)] == pytest.approx(expected, rel=1e-12), name
    loaded = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/model")
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(loaded(x), fitted.getModel()(x))


def fit_runs(tracking, parent) -> list:
    """The runs the fits made inside ``parent``, oldest first."""
    experiment = parent.info.experiment_id
    runs = tracking.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return sorted(runs, key=lambda r: r.info.start_time)


def test_under_an_active_run_each_fit_logs_to_a_run_of_its_own_unless_mlflow_is_false(
    spark, linear, tmp_path, tracking
) -> None:
    with mlflow.start_run() as parent:
        torch_estimator(tmp_path, epochs=1, mlflow=False).fit(linear)
        assert fit_runs(tracking, parent) == []
        first = torch_estimator(tmp_path, epochs=1).fit(linear)  # mlflow=None: under the active run
        second = torch_estimator(tmp_path, epochs=1, batch_size=64).fit(linear)  # other Params: no clash
    assert tracking.get_run(parent.info.run_id).data.params == {}
    runs = fit_runs(tracking, parent)
    assert [r.data.params["runId"] for r in runs] == [first.run_id, second.run_id]
    assert [r.data.params["batchSize"] for r in runs] == ["32", "64"]
    assert runs[1].data.metrics["loss"] == pytest.approx(second.history[0]["loss"])


def test_a_diverging_fit_still_finishes_and_logs_what_it_saw(spark, linear, tmp_path, tracking) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1).double()
    estimator = torch_estimator(tmp_path, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=1e5), epochs=2)
    with mlflow.start_run() as parent:
        fitted = estimator.fit(linear)
    assert not np.isfinite(fitted.history[-1]["loss"])
    (run,) = fit_runs(tracking, parent)
    logged = sorted(tracking.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in logged] == [1, 2] and not np.isfinite(logged[-1].value)


def test_the_mlflow_param_takes_true_false_or_none(tmp_path) -> None:
    with pytest.raises(TypeError, match="expected True, False or None, got 'yes'"):
        torch_estimator(tmp_path, mlflow="yes")


def test_a_keras_fit_logs_a_model_mlflow_keras_loads(spark, linear, tmp_path, tracking) -> None:
    keras = pytest.importorskip("keras", reason="needs keras: pip install 'hora[tensorflow]'")
    from hora.estimators import KerasEstimator

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    estimator = KerasEstimator(num_proc=2, model=model, optimizer="sgd", loss="mse", feature_cols=["features"],
                               label_cols=["y"], epochs=2, store=str(tmp_path / "store"), verbose=0)  # fmt: skip
    with mlflow.start_run() as parent:
        fitted = estimator.fit(linear)
    (run,) = fit_runs(tracking, parent)
    losses = sorted(tracking.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.value for m in losses] == pytest.approx([h["loss"] for h in fitted.history], rel=1e-6)
    assert run.data.params["optimizer"] == "sgd"  # as set
    loaded = mlflow.keras.load_model(f"runs:/{run.info.run_id}/model")
    x = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), fitted.getModel().predict(x, verbose=0), rtol=1e-6)


def test_spark_run_logs_rank_0s_metrics_only(spark, tracking) -> None:
    import hora.spark

    def train() -> None:
        import hora

        for step in range(1, 4):
            hora.spark.log_metrics({"loss": 1.0 / step + hora.rank(), "rank": hora.rank()}, step=step)

    with mlflow.start_run() as run:
        hora.spark.run(train, num_proc=2, spark=spark, verbose=0)
    history = sorted(tracking.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert {m.value for m in tracking.get_metric_history(run.info.run_id, "rank")} == {0.0}
    with pytest.raises(HoraError, match=r"inside the function that hora\.spark\.run runs"):
        hora.spark.log_metrics({"loss": 1.0})
