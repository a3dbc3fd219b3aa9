# Databricks notebook source
# MAGIC %md
# MAGIC # Fit a Keras 3 model on a Spark DataFrame with Hora's `KerasEstimator`
# MAGIC
# MAGIC The digits again (64 pixels and a label per row), fitted by a `KerasEstimator` on 2 Hora ranks: each rank
# MAGIC runs Keras's own `model.fit` with `hora.keras.DistributedOptimizer`, on the Keras backend this notebook
# MAGIC runs (TensorFlow by default; set `KERAS_BACKEND` to `jax` or `torch` before Keras is imported to change it).
# MAGIC The learning rate is multiplied by the number of ranks, as Horovod's KerasEstimator does.

# COMMAND ----------

# MAGIC %pip install "hora[tensorflow,spark]" scikit-learn

# COMMAND ----------

dbutils.widgets.text("store", "/Volumes/main/default/hora", "Store (a Volume or dbfs:/ path)")
dbutils.widgets.text("num_proc", "2", "Ranks")
store_path = dbutils.widgets.get("store")
num_proc = int(dbutils.widgets.get("num_proc"))

# COMMAND ----------

from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention
from sklearn.datasets import load_digits

digits = load_digits()
rows = [
    (Vectors.dense(pixels / 16.0), int(label), i % 5 == 0)
    for i, (pixels, label) in enumerate(zip(digits.data, digits.target, strict=True))
]
frame = spark.createDataFrame(rows, ["features", "label", "is_test"])
train_df, test_df = frame.where(~F.col("is_test")), frame.where(F.col("is_test"))

# COMMAND ----------

import keras
from hora.estimators import KerasEstimator
from hora.spark import Store

store = Store.create(store_path)
keras.utils.set_random_seed(0)
model = keras.Sequential(
    [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)], name="digits"
)
estimator = KerasEstimator(
    num_proc=num_proc,
    model=model,
    optimizer=keras.optimizers.Adam(learning_rate=0.002),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
    feature_cols=["features"],
    label_cols=["label"],
    validation=0.1,
    batch_size=32,
    epochs=6,
    store=store,
)
fitted = estimator.fit(train_df)
print(f"Keras backend: {keras.backend.backend()}")

# COMMAND ----------

display(fitted.getHistoryDataFrame(spark))

# COMMAND ----------

import numpy as np

scored = fitted.transform(test_df).select("label", "label__output").toPandas()
predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
accuracy = float((predicted == scored["label"].to_numpy()).mean())
print(f"test accuracy {accuracy:.4f} on {len(scored)} held-out rows")
assert accuracy > 0.9, accuracy

# COMMAND ----------

# MAGIC %md
# MAGIC ## Save and load; the Keras model itself
# MAGIC
# MAGIC `fitted.getModel()` is a compiled `keras.Model` (its optimizer in its trained state): evaluate it, keep
# MAGIC training it, or save it in Keras's own format.

# COMMAND ----------

from hora.estimators import KerasModel

model_path = store.join("models", "digits-keras")
fitted.write().overwrite().save(store.spark_path(model_path))
loaded = KerasModel.load(store.spark_path(model_path))
again = loaded.transform(test_df).select("label__output").toPandas()
assert np.allclose(np.stack(again["label__output"]), np.stack(scored["label__output"]))
x_test = np.stack([v.toArray() for v in test_df.select("features").toPandas()["features"]])
y_test = test_df.select("label").toPandas()["label"].to_numpy()
print(loaded.getModel().evaluate(x_test, y_test, verbose=0, return_dict=True))
