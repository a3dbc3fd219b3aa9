# Databricks notebook source
# MAGIC %md
# MAGIC # A hand-written PyTorch training loop on Spark with `hora.spark.run`
# MAGIC
# MAGIC `hora.spark.run(fn, num_proc=N)` runs `fn` on N Spark tasks at once (a barrier stage), each a Hora rank, and
# MAGIC returns their results in rank order. What the ranks print streams into this cell as they print it. This is
# MAGIC the Horovod-on-Spark script: only the import changes.

# COMMAND ----------

# MAGIC %pip install "hora[torch,spark]" scikit-learn

# COMMAND ----------

dbutils.widgets.text("num_proc", "2", "Ranks")
num_proc = int(dbutils.widgets.get("num_proc"))

# COMMAND ----------


def train(learning_rate: float, epochs: int) -> dict:
    """One rank's training: every rank takes its slice of the digits, rank 0 reports."""
    import hora.torch as hvd
    import torch
    from sklearn.datasets import load_digits

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    test = torch.arange(len(y)) % 5 == 0
    mine = torch.nonzero(~test).flatten()[hvd.rank() :: hvd.size()]  # this rank's rows

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(epochs):
        order = mine[torch.randperm(len(mine))]
        for batch in order.split(32):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        loss = hvd.allreduce(loss.detach(), name="loss")  # the mean over ranks
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{epochs}  loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(dim=1) == y[test]).float().mean().item()
    return {"rank": hvd.rank(), "accuracy": accuracy}


# COMMAND ----------

import hora.spark

results = hora.spark.run(train, args=(0.01, 10), num_proc=num_proc)
display(spark.createDataFrame(results))

# COMMAND ----------

# MAGIC %md
# MAGIC Every rank ends with the same weights (the gradients are averaged every step), so every rank's test
# MAGIC accuracy is the same.

# COMMAND ----------

assert len({round(r["accuracy"], 6) for r in results}) == 1, results
assert results[0]["accuracy"] > 0.9, results
print(f"test accuracy {results[0]['accuracy']:.4f} on every rank")
