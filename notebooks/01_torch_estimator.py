# Databricks notebook source
# MAGIC %md
# MAGIC # Fit a PyTorch model on a Spark DataFrame with Hora's `TorchEstimator`
# MAGIC
# MAGIC A DataFrame of scikit-learn's handwritten digits (64 pixels and a label per row) is fitted by a
# MAGIC `TorchEstimator` on 2 Hora ranks (Spark tasks), its per-epoch history shown, the model applied to held-out
# MAGIC rows with `transform`, and the fitted model saved and loaded again.
# MAGIC
# MAGIC Set the **store** widget to a Unity Catalog Volume (or a `dbfs:/` path) you can write to: the training data,
# MAGIC the per-epoch checkpoints and the saved model go there.

# COMMAND ----------

# MAGIC %pip install "hora[torch,spark]" scikit-learn

# COMMAND ----------

dbutils.widgets.text("store", "/Volumes/main/default/hora", "Store (a Volume or dbfs:/ path)")
dbutils.widgets.text("num_proc", "2", "Ranks")
store_path = dbutils.widgets.get("store")
num_proc = int(dbutils.widgets.get("num_proc"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The data: a vector column of pixels and an integer label

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
display(train_df.limit(5))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Fit on 2 ranks
# MAGIC
# MAGIC Each rank reads its shard of the data from the store; the gradients are averaged by Hora's ring allreduce;
# MAGIC rank 0 prints one line per epoch here and checkpoints every epoch under the run id (fitting again with the
# MAGIC same `runId` resumes).

# COMMAND ----------

import torch
from hora.estimators import TorchEstimator
from hora.spark import Store

store = Store.create(store_path)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
estimator = TorchEstimator(
    numProc=num_proc,
    model=net,
    optimizer=torch.optim.Adam(net.parameters(), lr=0.003),
    loss=torch.nn.functional.cross_entropy,
    metrics=["accuracy"],
    featureCols=["features"],
    labelCols=["label"],
    validation=0.1,
    batchSize=32,
    epochs=6,
    store=store,
)
model = estimator.fit(train_df)

# COMMAND ----------

display(model.getHistoryDataFrame(spark))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Predict on the held-out rows
# MAGIC
# MAGIC `transform` runs the model on the executors over Arrow batches and adds `label__output` (the 10 logits).

# COMMAND ----------

import numpy as np

scored = model.transform(test_df).select("label", "label__output").toPandas()
predicted = np.stack(scored["label__output"].to_numpy()).argmax(axis=1)
accuracy = float((predicted == scored["label"].to_numpy()).mean())
print(f"test accuracy {accuracy:.4f} on {len(scored)} held-out rows")
assert accuracy > 0.9, accuracy

# COMMAND ----------

# MAGIC %md
# MAGIC ## Save and load the fitted model

# COMMAND ----------

from hora.estimators import TorchModel

model_path = store.join("models", "digits-torch")
model.write().overwrite().save(store.spark_path(model_path))
loaded = TorchModel.load(store.spark_path(model_path))
again = loaded.transform(test_df).select("label__output").toPandas()
assert np.array_equal(np.stack(again["label__output"]), np.stack(scored["label__output"]))
print(f"saved to {model_path}; the loaded model predicts the same")
