"""Fit a KerasEstimator on a Spark DataFrame of scikit-learn's digits with 2 Hora ranks; print history and accuracy.

    python examples/spark/keras_estimator.py [--epochs 8] [--master local[2]]
    KERAS_BACKEND=jax python examples/spark/keras_estimator.py      # or torch; TensorFlow is Keras's default

``make demo`` runs it after the TorchEstimator demo: a local Spark session
(2 task slots), a DataFrame with a vector column of 64 pixels and an integer
label, a ``KerasEstimator`` trained with 2 processes on the Keras backend this
script runs, and the test accuracy from ``KerasModel.transform`` on held-out
rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import keras
import numpy as np
from digits_estimator import digits_frame  # this script's folder: the same DataFrame as the TorchEstimator demo
from hora.estimators import KerasEstimator
from hora.spark import Store
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-proc", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("hora-keras-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    frame = digits_frame(spark)
    train, test = frame.where(~F.col("is_test")), frame.where(F.col("is_test"))

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)], name="digits"
    )
    with tempfile.TemporaryDirectory() as directory:
        estimator = KerasEstimator(
            numProc=args.num_proc,
            model=model,
            optimizer=keras.optimizers.Adam(learning_rate=0.003),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            featureCols=["features"],
            labelCols=["label"],
            validation=0.1,
            batchSize=32,
            epochs=args.epochs,
            store=Store.create(directory),
            runId="digits-keras",
        )
        fitted = estimator.fit(train)
    print(f"\nhistory (Keras backend {keras.backend.backend()}, averaged over both ranks):")
    fitted.getHistoryDataFrame(spark).select("epoch", "loss", "accuracy", "val_loss", "val_accuracy").show()
    scored = fitted.transform(test).select("label", "label__output").toPandas()
    predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
    accuracy = float((predicted == scored["label"].to_numpy()).mean())
    print(f"test accuracy {accuracy:.4f} on {len(scored)} held-out rows (KerasModel.transform)")
    spark.stop()


if __name__ == "__main__":
    main()
