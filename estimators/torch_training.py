"""The training loop each rank runs for ``TorchEstimator.fit`` (under ``hora.spark.run``).

Rank 0's initial state (model, optimizer, and the latest checkpoint of the
run, if any) is broadcast to every rank; each rank reads its shard of the
data (see :mod:`hora.estimators.training`) and steps a
``DistributedOptimizer``. Per epoch the losses and metrics are summed over
rows on each rank and allreduced, so the history holds global averages.
Rank 0 writes a checkpoint after every epoch (model, optimizer, history),
so an interrupted fit resumes from its last complete epoch.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hora.estimators.training import Checkpoints, Progress, RunSpec, batch_arrays, epoch_batches, readers

__all__ = ["TorchSpec", "train_on_rank"]


@dataclass
class TorchSpec:
    """What a rank needs to train a torch model, cloudpickled from the driver."""

    run: RunSpec
    model: Any
    optimizer_class: type
    optimizer_state: dict
    losses: list[Callable[..., Any]]
    loss_weights: list[float]
    metrics: list[Any]
    compression: Any
    backward_passes_per_step: int
    callbacks: list[Any] = field(default_factory=list)


def _metric_fn(metric: Any) -> tuple[str, Callable[[Any, Any], Any]]:
    import torch

    if callable(metric):
        return getattr(metric, "__name__", type(metric).__name__), metric
    builtins = {
        "accuracy": lambda out, y: (
            (out.argmax(dim=-1) == y.reshape(-1)).float().mean()
            if out.dim() > 1 and out.shape[-1] > 1
            else ((out.reshape(-1) > 0.5).float() == y.reshape(-1).float()).float().mean()
        ),
        "mse": lambda out, y: torch.mean((out.reshape(-1).float() - y.reshape(-1).float()) ** 2),
        "mae": lambda out, y: torch.mean(torch.abs(out.reshape(-1).float() - y.reshape(-1).float())),
    }
    if metric not in builtins:
        raise ValueError(f"Unknown metric {metric!r}; pass a callable (output, label) or one of {sorted(builtins)}.")
    return metric, builtins[metric]


def _tensors(batch: dict[str, np.ndarray], spec: TorchSpec, dtype: Any) -> tuple[list, list, Any]:
    """Features, labels and sample weights of one batch as tensors (floating ones in the model's dtype)."""
    import torch

    float_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    features, labels, weights = batch_arrays(batch, spec.run, float_dtype)
    return (
        [torch.from_numpy(f) for f in features],
        [torch.from_numpy(y) for y in labels],
        None if weights is None else torch.from_numpy(weights),
    )


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _aligned(output: Any, label: Any) -> Any:
    """A floating label shaped like its output when they hold as many values (``(B,)`` against ``(B, 1)``)."""
    if label.is_floating_point() and label.numel() == output.numel():
        return label.reshape(output.shape)
    return label


def train_on_rank(spec: TorchSpec) -> dict | None:
    """Trains on this rank; rank 0 returns the trained state dict and the history, the others None."""
    import hora.torch as hvd
    import torch
    from hora.spark import log_metrics

    hvd.init()
    run = spec.run
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(run.seed)
    model = spec.model
    optimizer = spec.optimizer_class(model.parameters(), lr=0.001)
    optimizer.load_state_dict(spec.optimizer_state)
    history: list[dict[str, float]] = []
    checkpoints = Checkpoints(run.store, run.run_id, ".pt")
    latest = checkpoints.latest() if hvd.rank() == 0 else None
    if latest is not None:
        checkpoint = torch.load(io.BytesIO(latest), map_location="cpu", weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        history = checkpoint["history"]
    history = hvd.broadcast_object(history, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=spec.compression,
        backward_passes_per_step=spec.backward_passes_per_step,
    )  # fmt: skip
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    metrics = [_metric_fn(m) for m in spec.metrics]
    train, val, train_steps, val_steps = readers(run)

    output_sizes: list[int] = []  # values per row of each model output, for TorchModel.transform's schema

    def run_batches(reader: Any, steps: int, training: bool, epoch: int) -> dict[str, float]:
        model.train(training)
        totals = torch.zeros(2 + len(metrics), dtype=torch.float64)  # rows, loss sum, metric sums
        passes = 0
        for step, batch in enumerate(epoch_batches(reader, steps, epoch if training else 1)):
            features, labels, weights = _tensors(batch, spec, dtype)
            with torch.set_grad_enabled(training):
                outputs = _outputs(model(*features))
                loss = 0
                for fn, weight, out, y in zip(spec.losses, spec.loss_weights, outputs, labels, strict=False):
                    value = fn(out, _aligned(out, y))
                    if weights is not None:
                        value = torch.mean(value.reshape(-1) * weights)
                    loss = loss + weight * value
                if training:
                    if passes == 0:
                        optimizer.zero_grad()
                    (loss / spec.backward_passes_per_step).backward()
                    passes += 1
                    if passes == spec.backward_passes_per_step:
                        optimizer.step()
                        passes = 0
            if not output_sizes:
                output_sizes.extend(out.shape[1:].numel() for out in outputs)
            rows = len(labels[0])
            values = [float(fn(outputs[0].detach(), _aligned(outputs[0], labels[0]))) for _, fn in metrics]
            totals += torch.tensor(
                [rows, float(loss.detach()) * rows, *[v * rows for v in values]], dtype=torch.float64
            )
            if training and run.verbose >= 2 and hvd.rank() == 0 and (step + 1) % max(steps // 5, 1) == 0:
                print(f"epoch {epoch}: step {step + 1}/{steps} loss {float(loss.detach()):.4f}", flush=True)
        if training and passes:
            optimizer.step()  # the last, partial accumulation
        totals = hvd.allreduce(totals, op=hvd.Sum, name=f"metrics.{'train' if training else 'val'}.{epoch}")
        rows = float(totals[0])
        if training:
            seen["rows"] = rows
        prefix = "" if training else "val_"
        result = {f"{prefix}loss": float(totals[1]) / rows}
        result.update({f"{prefix}{name}": float(totals[2 + i]) / rows for i, (name, _) in enumerate(metrics)})
        return result

    progress, seen = Progress(run.epochs, train_steps), {"rows": 0.0}  # rows: this epoch's, over every rank
    for epoch in range(len(history) + 1, run.epochs + 1):
        progress.start_epoch()
        record = {"epoch": float(epoch), **run_batches(train, train_steps, True, epoch)}
        if val is not None:
            with torch.no_grad():
                record.update(run_batches(val, val_steps, False, epoch))
        history.append(record)
        if run.tracked:
            log_metrics({k: v for k, v in record.items() if k != "epoch"}, step=epoch)  # rank 0's reach MLflow
        if hvd.rank() == 0:
            buffer = io.BytesIO()
            torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "history": history}, buffer)  # fmt: skip
            checkpoints.save(epoch, buffer.getvalue())
            if run.verbose >= 1:
                print(progress.line(epoch, record, seen["rows"]), flush=True)
            for callback in spec.callbacks:
                hook = getattr(callback, "on_epoch_end", None)
                if hook is not None:
                    hook(epoch, dict(record))
        hvd.barrier()  # no rank starts the next epoch before the checkpoint is written
    if hvd.rank() != 0:
        return None
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {"state_dict": state, "history": history, "output_sizes": output_sizes}
