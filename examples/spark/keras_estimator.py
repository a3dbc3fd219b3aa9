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

import tempfile

import keras
from digits_estimator import demo_arguments, demo_session, report, train_and_test  # the TorchEstimator demo's
from hora.estimators import KerasEstimator
from hora.spark import Store


def main() -> None:
    args = demo_arguments(__doc__)
    spark = demo_session(args.master, "hora-keras-demo")
    train, test = train_and_test(spark)

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
    report(spark, fitted, test, "KerasModel.transform")
    spark.stop()


if __name__ == "__main__":
    main()
