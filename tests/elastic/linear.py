"""An elastic worker of the launcher tests: linear regression with TorchState, ElasticSampler and commits.

Ranks 0 and 1 form a process set given to ``hvd.init``; after every commit
they add up the step over it, so every reset must register the set again
(and a worker that joins registers it in its own ``init``).

The global batch is GLOBAL_BATCH samples whatever the number of ranks (each
rank takes GLOBAL_BATCH / size of them), and the gradient is averaged over
equal shards: so the weights are those of one process stepping through the
same global batches, however often the job shrinks or grows, as long as no
committed step is lost or repeated (see :func:`reference`).

Environment (all optional):
    ELASTIC_OUT: rank 0 writes {"weights", "sizes", "steps"} there at the end.
    ELASTIC_KILL_HOST / ELASTIC_KILL_STEP: the worker on that host SIGKILLs
        itself when it is about to take that step (counted over the job).
    ELASTIC_KILL_INDEX: the same for the worker of that index (HORA_WORKER_INDEX).
    ELASTIC_FAIL_HOST: every worker on that host exits with 3 at its first step.
    ELASTIC_HOSTS_FILE / ELASTIC_HOSTS_AT / ELASTIC_HOSTS_TEXT: rank 0
        writes the text into the discovery file before that step, then waits
        until the job has re-formed (ELASTIC_GROW_TO ranks) at a commit.
    ELASTIC_STEP_SLEEP: seconds each step sleeps (to give discovery time).
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import torch

EPOCHS = 2
SAMPLES = 96
GLOBAL_BATCH = 12
FEATURES = 4
LR = 0.1
COMMIT_EVERY = 2


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((SAMPLES, FEATURES))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal(SAMPLES)
    return x, y


def reference(steps_per_epoch_order: list[list[int]] | None = None) -> np.ndarray:
    """The weights of one process stepping through every global batch of every epoch, in order."""
    import random

    x, y = data()
    w = np.zeros(FEATURES)
    for epoch in range(EPOCHS):
        order = list(range(SAMPLES))
        random.Random(epoch).shuffle(order)
        for start in range(0, SAMPLES, GLOBAL_BATCH):
            batch = order[start : start + GLOBAL_BATCH]
            residual = x[batch] @ w - y[batch]
            w = w - LR * (2 * x[batch].T @ residual / len(batch))
    return w


def train_job() -> dict:
    """Trains; returns this worker's {"weights", "sizes", "steps", "pair"} (the same on every rank; "pair" is the
    process set's id in the last round)."""
    import hora.torch as hvd

    torch.set_num_threads(1)
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    x, y = (torch.from_numpy(a) for a in data())
    model = torch.nn.Linear(FEATURES, 1, bias=False).double()
    torch.nn.init.zeros_(model.weight)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR))
    sampler = hvd.elastic.ElasticSampler(range(SAMPLES), shuffle=True, seed=0)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0, sizes=[])
    host = os.environ.get("HORA_HOSTNAME", "")
    doomed = host == os.environ.get("ELASTIC_KILL_HOST") or os.environ.get("HORA_WORKER_INDEX") == os.environ.get(
        "ELASTIC_KILL_INDEX", "-"
    )
    sleep = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        if not state.sizes or state.sizes[-1] != hvd.size():
            state.sizes = [*state.sizes, hvd.size()]
        while state.epoch < EPOCHS:
            per_rank = GLOBAL_BATCH // hvd.size()
            mine = list(state.sampler)
            for start in range(0, len(mine), per_rank):
                if host == os.environ.get("ELASTIC_FAIL_HOST"):
                    raise SystemExit(3)
                if doomed and state.step == int(os.environ["ELASTIC_KILL_STEP"]):
                    os.kill(os.getpid(), signal.SIGKILL)
                if hvd.rank() == 0 and state.step == int(os.environ.get("ELASTIC_HOSTS_AT", "-1")):
                    with open(os.environ["ELASTIC_HOSTS_FILE"], "w") as hosts:
                        hosts.write(os.environ["ELASTIC_HOSTS_TEXT"])
                batch = mine[start : start + per_rank]
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[batch]).squeeze(1), y[batch])
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(start // per_rank, per_rank)
                state.step += 1
                time.sleep(sleep)
                if state.step % COMMIT_EVERY == 0:
                    state.commit()
                    if pair.included():
                        step = torch.tensor([float(state.step)])
                        agreed = hvd.allreduce(step, op=hvd.Sum, process_set=pair, name=f"pair.{state.step}")
                        assert agreed.item() == 2 * state.step, (agreed, state.step)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    weights = model.weight.detach().numpy()[0].tolist()
    return {"weights": weights, "sizes": state.sizes, "steps": state.step, "pair": pair.process_set_id}


def main() -> None:
    import hora

    result = train_job()
    if hora.rank() == 0 and os.environ.get("ELASTIC_OUT"):
        with open(os.environ["ELASTIC_OUT"], "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    main()
