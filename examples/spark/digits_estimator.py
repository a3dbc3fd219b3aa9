"""Fit a TorchEstimator on a Spark DataFrame of scikit-learn's digits with 2 Hora ranks; print history and accuracy.

    python examples/spark/digits_estimator.py [--epochs 8] [--master local[2]]

This is what ``make demo`` runs: a local Spark session (2 task slots), a
DataFrame with a vector column of 64 pixels and an integer label, a
``TorchEstimator`` trained with 2 processes, and the test accuracy computed
from ``TorchModel.transform`` on held-out rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from hora.estimators import TorchEstimator
from hora.spark import Store
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention
from sklearn.datasets import load_digits


def digits_frame(spark: SparkSession):
    digits = load_digits()
    rows = [
        (Vectors.dense(x / 16.0), int(y), i % 5 == 0)
        for i, (x, y) in enumerate(zip(digits.data, digits.target, strict=True))
    ]
    return spark.createDataFrame(rows, ["features", "label", "is_test"])


def demo_arguments(doc: str) -> argparse.Namespace:
    """The demos' command line: --epochs, --master, --num-proc."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--num-proc", type=int, default=2)
    return parser.parse_args()


def demo_session(master: str, app: str) -> SparkSession:
    """A Spark session for a demo, quiet, its driver on SPARK_LOCAL_IP (default loopback)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def train_and_test(spark: SparkSession):
    """The digits split into training rows and the held-out fifth."""
    frame = digits_frame(spark)
    return frame.where(~F.col("is_test")), frame.where(F.col("is_test"))


def report(spark: SparkSession, model, test, what: str) -> None:
    """Prints the model's per-epoch history and its accuracy on the held-out rows (through ``transform``)."""
    model.getHistoryDataFrame(spark).select("epoch", "loss", "accuracy", "val_loss", "val_accuracy").show()
    scored = model.transform(test).select("label", "label__output").toPandas()
    predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
    accuracy = float((predicted == scored["label"].to_numpy()).mean())
    print(f"test accuracy {accuracy:.4f} on {len(scored)} held-out rows ({what})")


def main() -> None:
    args = demo_arguments(__doc__)
    spark = demo_session(args.master, "hora-demo")
    train, test = train_and_test(spark)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with tempfile.TemporaryDirectory() as directory:
        estimator = TorchEstimator(
            numProc=args.num_proc,
            model=net,
            optimizer=torch.optim.Adam(net.parameters(), lr=0.003),
            loss=torch.nn.functional.cross_entropy,
            metrics=["accuracy"],
            featureCols=["features"],
            labelCols=["label"],
            validation=0.1,
            batchSize=32,
            epochs=args.epochs,
            store=Store.create(directory),
            runId="digits",
        )
        model = estimator.fit(train)
    print("\nhistory (averaged over both ranks):")
    report(spark, model, test, "TorchModel.transform")
    spark.stop()


if __name__ == "__main__":
    main()
