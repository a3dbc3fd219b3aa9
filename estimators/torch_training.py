"""The training loop each rank runs for ``TorchEstimator.fit`` (under ``hora.spark.run``).

Rank 0's initial state (model, optimizer, and the latest checkpoint of the
run, if any) is broadcast to every rank; each rank reads its shard of the
Parquet data with :class:`hora.spark.ShardReader` (the same number of steps
everywhere) and steps a ``DistributedOptimizer``. Per epoch the losses and
metrics are summed over rows on each rank and allreduced, so the history
holds global averages. Rank 0 writes a checkpoint after every epoch
(model, optimizer, history) with an atomic rename, so an interrupted fit
resumes from its last complete epoch.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TrainingSpec", "train_on_rank"]

CHECKPOINT_FORMAT = "epoch-{:05d}.pt"


@dataclass
class TrainingSpec:
    """Everything a rank needs to train, cloudpickled from the driver."""

    model: Any
    optimizer_class: type
    optimizer_state: dict
    losses: list[Callable[..., Any]]
    loss_weights: list[float]
    metrics: list[Any]
    feature_cols: list[str]
    label_cols: list[str]
    sample_weight_col: str | None
    input_shapes: list[list[int]] | None
    store: Any
    run_id: str
    train_path: str
    val_path: str | None
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps: int | None
    val_steps: int | None
    shuffle_buffer_size: int
    seed: int
    compression: Any
    backward_passes_per_step: int
    transformation_fn: Callable[[dict], dict] | None
    callbacks: list[Any] = field(default_factory=list)
    verbose: int = 1


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


def _tensors(batch: dict[str, np.ndarray], spec: TrainingSpec, dtype: Any) -> tuple[list, list, Any]:
    """Features (reshaped, in the model's floating dtype), labels and sample weights of one batch."""
    import torch

    if spec.transformation_fn is not None:
        batch = spec.transformation_fn(batch)
    features = []
    for i, column in enumerate(spec.feature_cols):
        tensor = torch.from_numpy(np.ascontiguousarray(batch[column]))
        tensor = tensor.to(dtype) if tensor.is_floating_point() or tensor.dtype == torch.bool else tensor
        if spec.input_shapes is not None:
            tensor = tensor.reshape(spec.input_shapes[i])
        elif tensor.dim() == 1:
            tensor = tensor.reshape(-1, 1)  # a scalar column is one feature per row
        features.append(tensor)
    labels = []
    for column in spec.label_cols:
        label = torch.from_numpy(np.ascontiguousarray(batch[column]))
        labels.append(label.to(dtype) if label.is_floating_point() else label)
    weights = None
    if spec.sample_weight_col is not None:
        weights = torch.from_numpy(np.ascontiguousarray(batch[spec.sample_weight_col])).to(dtype)
    return features, labels, weights


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _aligned(output: Any, label: Any) -> Any:
    """A floating label shaped like its output when they hold as many values (``(B,)`` against ``(B, 1)``)."""
    if label.is_floating_point() and label.numel() == output.numel():
        return label.reshape(output.shape)
    return label


def _batches(reader: Any, steps: int) -> Iterator[dict[str, np.ndarray]]:
    """``steps`` batches, continuing into the reader's next epochs when one pass is shorter."""
    epoch, taken = 0, 0
    while taken < steps:
        for batch in reader.numpy_batches(epoch):
            yield batch
            taken += 1
            if taken == steps:
                return
        epoch += 1


def _latest_checkpoint(spec: TrainingSpec) -> dict | None:
    import torch

    directory = spec.store.checkpoint_path(spec.run_id)
    names = [n for n in spec.store.listdir(directory) if n.startswith("epoch-") and n.endswith(".pt")]
    if not names:
        return None
    data = spec.store.read_bytes(f"{directory}/{max(names)}")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def train_on_rank(spec: TrainingSpec) -> dict | None:
    """Trains on this rank; rank 0 returns the trained state dict and the history, the others None."""
    import hora.torch as hvd
    import torch
    from hora.spark import ShardReader

    hvd.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(spec.seed)
    model = spec.model
    optimizer = spec.optimizer_class(model.parameters(), lr=0.001)
    optimizer.load_state_dict(spec.optimizer_state)
    history: list[dict[str, float]] = []
    checkpoint = _latest_checkpoint(spec) if hvd.rank() == 0 else None
    if checkpoint is not None:
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
    train = ShardReader(spec.store, spec.train_path, batch_size=spec.batch_size,
                        shuffle_buffer_size=spec.shuffle_buffer_size, seed=spec.seed)  # fmt: skip
    val = ShardReader(spec.store, spec.val_path, batch_size=spec.val_batch_size) if spec.val_path else None
    train_steps = spec.train_steps or len(train)
    val_steps = (spec.val_steps or len(val)) if val is not None else 0

    output_sizes: list[int] = []  # values per row of each model output, for TorchModel.transform's schema

    def run_batches(reader: Any, steps: int, training: bool, epoch: int) -> dict[str, float]:
        model.train(training)
        totals = torch.zeros(2 + len(metrics), dtype=torch.float64)  # rows, loss sum, metric sums
        passes = 0
        for step, batch in enumerate(_batches(reader, steps)):
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
            if training and spec.verbose >= 2 and hvd.rank() == 0 and (step + 1) % max(steps // 5, 1) == 0:
                print(f"epoch {epoch}: step {step + 1}/{steps} loss {float(loss.detach()):.4f}", flush=True)
        if training and passes:
            optimizer.step()  # the last, partial accumulation
        totals = hvd.allreduce(totals, op=hvd.Sum, name=f"metrics.{'train' if training else 'val'}.{epoch}")
        rows = float(totals[0])
        prefix = "" if training else "val_"
        result = {f"{prefix}loss": float(totals[1]) / rows}
        result.update({f"{prefix}{name}": float(totals[2 + i]) / rows for i, (name, _) in enumerate(metrics)})
        return result

    for epoch in range(len(history) + 1, spec.epochs + 1):
        record = {"epoch": float(epoch), **run_batches(train, train_steps, True, epoch)}
        if val is not None:
            with torch.no_grad():
                record.update(run_batches(val, val_steps, False, epoch))
        history.append(record)
        if hvd.rank() == 0:
            _save_checkpoint(spec, epoch, model, optimizer, history)
            if spec.verbose >= 1:
                print("  ".join([f"epoch {epoch}/{spec.epochs}"] + [f"{k} {v:.4f}" for k, v in record.items()
                                                                     if k != "epoch"]), flush=True)  # fmt: skip
            for callback in spec.callbacks:
                hook = getattr(callback, "on_epoch_end", None)
                if hook is not None:
                    hook(epoch, dict(record))
        hvd.barrier()  # no rank starts the next epoch before the checkpoint is written
    if hvd.rank() != 0:
        return None
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {"state_dict": state, "history": history, "output_sizes": output_sizes}


def _save_checkpoint(spec: TrainingSpec, epoch: int, model: Any, optimizer: Any, history: list) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "history": history}, buffer)  # fmt: skip
    path = f"{spec.store.checkpoint_path(spec.run_id)}/{CHECKPOINT_FORMAT.format(epoch)}"
    spec.store.write_bytes(path, buffer.getvalue())
