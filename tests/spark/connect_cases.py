"""Script: ``hora.spark.run`` and the estimators on a real local Spark Connect server (no ``sparkContext``).

A process holds either a classic SparkSession or a local Connect one, so
this runs apart from the test session's: ``python -m tests.spark.connect_cases``
starts ``SparkSession.builder.remote("local[2]")`` (pyspark's own local
Connect server), runs every case, prints ``FAILED <case>`` with the
traceback of each failure and, last, ``connect: P of T cases passed``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

import numpy as np

from tests.worker import run_each


def cases(spark):
    import hora.spark
    from hora.exceptions import HoraError
    from hora.spark.barrier import is_connect

    def the_session_is_connect():
        assert is_connect(spark) and type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)

    yield "the session is a Connect session", the_session_is_connect

    def run_returns_in_rank_order():
        def fn(scale):
            import hora

            print(f"hello from rank {hora.rank()}", flush=True)
            return hora.rank() * scale, float(hora.allreduce(np.array([hora.rank() + 1.0]), op=hora.Sum)[0])

        lines = []

        class Lines:
            def write(self, text):
                lines.append(text)

            def flush(self):
                pass

        results = hora.spark.run(fn, args=(10,), stdout=Lines())  # num_proc: the 2 slots of local[2]
        assert results == [(0, 3.0), (10, 3.0)], results
        printed = "".join(lines)
        assert "[0]<stdout>:hello from rank 0" in printed and "[1]<stdout>:hello from rank 1" in printed, printed

    yield "hora.spark.run: results in rank order, output streamed", run_returns_in_rank_order

    def a_failing_rank_fails_the_run_naming_it():
        def fn():
            import hora

            if hora.rank() == 1:
                raise RuntimeError("rank 1 gives up")
            hora.allreduce(np.ones(3), name="never")

        started = time.monotonic()
        try:
            hora.spark.run(fn, num_proc=2, verbose=0)
        except HoraError as error:
            assert "rank 1 failed" in str(error) and "rank 1 gives up" in str(error), str(error)
        else:
            raise AssertionError("the run did not fail")
        assert time.monotonic() - started < 60

    yield "hora.spark.run: a failing rank fails the run, named", a_failing_rank_fails_the_run_naming_it

    def more_ranks_than_slots_is_refused():
        try:
            hora.spark.run(print, num_proc=3)
        except HoraError as error:
            assert "num_proc=3 but this Spark cluster (local[2]) can run only 2 tasks" in str(error), str(error)
        else:
            raise AssertionError("num_proc=3 ran on 2 slots")

    yield "hora.spark.run: more ranks than slots is refused", more_ranks_than_slots_is_refused

    def linear_frame():
        from pyspark.ml.linalg import Vectors

        rng = np.random.default_rng(0)
        x = rng.standard_normal((600, 3))
        y = x @ np.array([1.5, -2.0, 0.5]) + 0.25
        return spark.createDataFrame([(Vectors.dense(f), float(t)) for f, t in zip(x, y, strict=True)],
                                     ["features", "y"])  # fmt: skip

    def torch_estimator_fits_and_transforms():
        import torch
        from hora.estimators import TorchEstimator

        frame = linear_frame()
        torch.manual_seed(0)
        net = torch.nn.Linear(3, 1).double()
        estimator = TorchEstimator(
            model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss=torch.nn.functional.mse_loss,
            feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=3, validation=0.2,
            store=tempfile.mkdtemp(prefix="hora-connect-"), verbose=0,
        )  # fmt: skip
        model = estimator.fit(frame)  # numProc: the 2 slots of local[2]
        np.testing.assert_allclose(model.getModel().weight.detach().numpy(), [[1.5, -2.0, 0.5]], atol=1e-3)
        assert [h["epoch"] for h in model.history] == [1.0, 2.0, 3.0] and "val_loss" in model.history[-1]
        rows = model.transform(frame).select("y", "y__output").toPandas()
        assert len(rows) == 600
        np.testing.assert_allclose(rows["y__output"], rows["y"], atol=1e-2)
        history = model.getHistoryDataFrame(spark).toPandas()
        assert list(history["epoch"]) == [1.0, 2.0, 3.0]

    yield "TorchEstimator: fit and transform", torch_estimator_fits_and_transforms

    def keras_estimator_fits_and_transforms():
        import keras
        from hora.estimators import KerasEstimator

        frame = linear_frame()
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        estimator = KerasEstimator(
            num_proc=2, model=model, optimizer=keras.optimizers.SGD(0.05), loss="mse", feature_cols=["features"],
            label_cols=["y"], batch_size=16, epochs=3, store=tempfile.mkdtemp(prefix="hora-connect-"), verbose=0,
        )  # fmt: skip
        fitted = estimator.fit(frame)
        np.testing.assert_allclose(fitted.getModel().get_weights()[0][:, 0], [1.5, -2.0, 0.5], atol=1e-3)
        rows = fitted.transform(frame).select("y", "y__output").toPandas()
        np.testing.assert_allclose(rows["y__output"], rows["y"], atol=1e-2)

    yield "KerasEstimator: fit and transform", keras_estimator_fits_and_transforms


def main() -> int:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with warnings.catch_warnings():  # a local Connect server's static configs are fixed: it says so, harmlessly
        warnings.simplefilter("ignore", UserWarning)
        spark = SparkSession.builder.remote("local[2]").getOrCreate()
    try:
        return run_each(cases(spark), "connect")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
