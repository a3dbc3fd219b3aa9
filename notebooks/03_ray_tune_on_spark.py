# Databricks notebook source
# MAGIC %md
# MAGIC # Ray on the Spark cluster, and a Tune sweep whose trials are distributed Hora jobs
# MAGIC
# MAGIC `ray.util.spark.setup_ray_cluster` (the Databricks way to run Ray) starts a Ray head node on the driver and
# MAGIC Ray worker nodes as long-running Spark tasks. A Ray Tune sweep then runs on that cluster; each trial is a
# MAGIC Hora job of several ranks (`hora.ray.tune.distributed_trainable`: one placement group per trial, a rank per
# MAGIC bundle), rank 0 reports the validation accuracy after every epoch, and the ASHA scheduler stops the weak
# MAGIC trials early.
# MAGIC
# MAGIC Set the **store** widget to a Unity Catalog Volume (or a `/dbfs` path) every node can read: Tune keeps its
# MAGIC results there. The Ray workers hold Spark's task slots while the cluster is up; the last cell gives them back
# MAGIC (run it also when a cell before it failed).

# COMMAND ----------

# MAGIC %pip install "hora[torch,ray]" "ray[default]" scikit-learn

# COMMAND ----------

dbutils.widgets.text("store", "/Volumes/main/default/hora", "Store (a Volume or /dbfs path)")
dbutils.widgets.text("ray_worker_nodes", "2", "Ray worker nodes")
dbutils.widgets.text("ranks_per_trial", "2", "Hora ranks per trial")
dbutils.widgets.text("cpus_per_rank", "0.25", "CPUs per rank")
dbutils.widgets.text("ray_dashboard", "true", "Start Ray's dashboard (true/false)")
store_path = dbutils.widgets.get("store")
ray_worker_nodes = int(dbutils.widgets.get("ray_worker_nodes"))
ranks_per_trial = int(dbutils.widgets.get("ranks_per_trial"))
cpus_per_rank = float(dbutils.widgets.get("cpus_per_rank"))
ray_dashboard = dbutils.widgets.get("ray_dashboard").lower() == "true"

# COMMAND ----------

# MAGIC %md
# MAGIC ## Ray on Spark
# MAGIC
# MAGIC On a Databricks cluster each Ray worker node takes a whole Spark worker's CPUs; on a local Spark, one task
# MAGIC slot each. `setup_ray_cluster` sets `RAY_ADDRESS`, so `ray.init()` joins the new cluster. Ray's dashboard
# MAGIC needs `ray[default]` (installed above); without it, set the **ray_dashboard** widget to `false`, or Ray waits
# MAGIC a minute for a dashboard that cannot start.

# COMMAND ----------

import ray
from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

setup_ray_cluster(max_worker_nodes=ray_worker_nodes, head_node_options={"include_dashboard": ray_dashboard})
ray.init(logging_level="ERROR")
print({name: value for name, value in ray.cluster_resources().items() if name in ("CPU", "GPU")})

# COMMAND ----------

# MAGIC %md
# MAGIC ## One trial: a training function every rank runs
# MAGIC
# MAGIC The ordinary Hora PyTorch script: `DistributedOptimizer` averages the gradients, every rank trains on its
# MAGIC slice of the digits, and `hora.ray.tune.report` hands rank 0's metrics to Tune (the other ranks' calls do
# MAGIC nothing).

# COMMAND ----------


def train_digits(config: dict) -> None:
    import hora.ray.tune
    import hora.torch as hvd
    import torch
    from sklearn.datasets import load_digits

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    validation = torch.arange(len(y)) % 4 == 0
    mine = torch.nonzero(~validation).flatten()[hvd.rank() :: hvd.size()]  # this rank's rows

    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    for epoch in range(1, config["epochs"] + 1):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for batch in order.split(32):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x[validation]).argmax(dim=1) == y[validation]).float().mean()
        accuracy = hvd.allreduce(accuracy, name=f"accuracy.{epoch}").item()  # the mean over ranks
        hora.ray.tune.report({"epoch": epoch, "val_accuracy": accuracy})


# COMMAND ----------

# MAGIC %md
# MAGIC ## The sweep
# MAGIC
# MAGIC A grid over the learning rate and the hidden width; ASHA compares the trials after every epoch and stops
# MAGIC the bottom ones. Each trial asks Ray for one bundle per rank (`cpus_per_rank` CPUs each).

# COMMAND ----------

import hora.ray.tune
from ray import tune

trainable = hora.ray.tune.distributed_trainable(train_digits, num_workers=ranks_per_trial,
                                                cpus_per_worker=cpus_per_rank)  # fmt: skip
tuner = tune.Tuner(
    trainable,
    param_space={"lr": tune.grid_search([0.003, 0.03]), "hidden": tune.grid_search([32, 128]), "epochs": 4},
    tune_config=tune.TuneConfig(
        metric="val_accuracy",
        mode="max",
        scheduler=tune.schedulers.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2),
    ),
    run_config=tune.RunConfig(name="hora-digits", storage_path=f"{store_path}/tune", verbose=0),
)
results = tuner.fit()
table = results.get_dataframe()[["config/lr", "config/hidden", "epoch", "val_accuracy"]]
display(table.sort_values("val_accuracy", ascending=False))

# COMMAND ----------

best = results.get_best_result()
print(f"best: lr={best.config['lr']}, hidden={best.config['hidden']}: "
      f"validation accuracy {best.metrics['val_accuracy']:.4f} after {best.metrics['epoch']} epochs")  # fmt: skip
assert not results.errors, results.errors
assert best.metrics["val_accuracy"] > 0.9, best.metrics

# COMMAND ----------

# MAGIC %md
# MAGIC ## Give the task slots back to Spark

# COMMAND ----------

ray.shutdown()
shutdown_ray_cluster()
