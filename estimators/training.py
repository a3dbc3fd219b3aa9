"""What every estimator's ranks share, whatever the framework: the data, the epochs, the checkpoints, the report.

A fit is described by a :class:`RunSpec` (cloudpickled from the driver with
the framework's own spec). Each rank reads its shard of the Parquet data with
:class:`hora.spark.ShardReader`, the same number of steps on every rank;
training epoch ``e`` starts a fresh pass of the reader (a new shuffle, and
with shuffling another shard), so a resumed fit sees what an uninterrupted
one would. Rank 0 writes one checkpoint per epoch through the store's atomic
write, and an interrupted fit resumes from the last one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Checkpoints", "Progress", "RunSpec", "batch_arrays", "epoch_batches", "epoch_rows", "readers"]


@dataclass
class RunSpec:
    """The data and the schedule of one fit, the same for every framework."""

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
    transformation_fn: Callable[[dict], dict] | None
    verbose: int = 1
    tracked: bool = False  # rank 0 sends each epoch's metrics to the driver's MLflow run


def readers(run: RunSpec) -> tuple[Any, Any, int, int]:
    """This rank's training and validation readers (None without validation) and the steps per epoch of each."""
    from hora.spark import ShardReader

    train = ShardReader(run.store, run.train_path, batch_size=run.batch_size,
                        shuffle_buffer_size=run.shuffle_buffer_size, seed=run.seed)  # fmt: skip
    val = ShardReader(run.store, run.val_path, batch_size=run.val_batch_size) if run.val_path else None
    return train, val, run.train_steps or len(train), (run.val_steps or len(val)) if val is not None else 0


def _passes(reader: Any, steps: int, epoch: int) -> Iterator[int]:
    """The reader epochs that training epoch ``epoch`` (1-based) takes its ``steps`` batches from, in order."""
    per_epoch = math.ceil(steps / len(reader))
    first = (epoch - 1) * per_epoch
    return iter(range(first, first + per_epoch))


def epoch_batches(reader: Any, steps: int, epoch: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """The ``steps`` batches of training epoch ``epoch`` (1-based), continuing into more passes when one is short.

    Every epoch begins a pass of its own, so no epoch repeats another's order
    and a fit resumed at epoch ``e`` reads what it would have read.
    """
    taken = 0
    for reader_epoch in _passes(reader, steps, epoch):
        for batch in reader.numpy_batches(reader_epoch):
            yield batch
            taken += 1
            if taken == steps:
                return


def epoch_rows(reader: Any, steps: int, epoch: int = 1) -> int:
    """How many rows :func:`epoch_batches` yields for ``epoch``, from the Parquet footers alone."""
    sizes = [size for reader_epoch in _passes(reader, steps, epoch) for size in reader.batch_sizes(reader_epoch)]
    return sum(sizes[:steps])


def batch_arrays(
    batch: dict[str, np.ndarray], run: RunSpec, float_dtype: np.dtype
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None]:
    """The features, labels and sample weights of one batch, ready for a model.

    ``transformation_fn`` is applied first. Floating and boolean features and
    floating labels become ``float_dtype``; a feature is reshaped to its
    ``input_shapes`` entry, or to one column when it holds one value per row.
    """
    if run.transformation_fn is not None:
        batch = run.transformation_fn(batch)
    features = []
    for i, column in enumerate(run.feature_cols):
        values = np.asarray(batch[column])
        if values.dtype.kind in "fb":
            values = values.astype(float_dtype, copy=False)
        if run.input_shapes is not None:
            values = values.reshape(run.input_shapes[i])
        elif values.ndim == 1:
            values = values.reshape(-1, 1)
        features.append(np.ascontiguousarray(values))
    labels = []
    for column in run.label_cols:
        values = np.asarray(batch[column])
        if values.dtype.kind == "f":
            values = values.astype(float_dtype, copy=False)
        labels.append(np.ascontiguousarray(values))
    weights = None
    if run.sample_weight_col is not None:
        weights = np.ascontiguousarray(np.asarray(batch[run.sample_weight_col]).astype(float_dtype, copy=False))
    return features, labels, weights


class Checkpoints:
    """A run's checkpoints in its store, one file per epoch (``epoch-00003.pt``), each written atomically."""

    def __init__(self, store: Any, run_id: str, suffix: str) -> None:
        self.store = store
        self.directory = store.checkpoint_path(run_id)
        self.suffix = suffix

    def latest(self) -> bytes | None:
        """The last checkpoint's bytes (it holds its history, so its epoch), or None before the first."""
        names = [n for n in self.store.listdir(self.directory) if n.startswith("epoch-") and n.endswith(self.suffix)]
        return self.store.read_bytes(f"{self.directory}/{max(names)}") if names else None

    def save(self, epoch: int, data: bytes) -> None:
        self.store.write_bytes(f"{self.directory}/epoch-{epoch:05d}{self.suffix}", data)


class Progress:
    """Rank 0's line after each epoch: the metrics, the steps, the training rows per second of every rank
    together and the time left at this pace. One line per epoch, in a notebook cell as on a console or in a log.
    """

    def __init__(self, epochs: int, steps: int) -> None:
        self.epochs, self.steps = epochs, steps
        self._started = time.monotonic()
        self._epoch_started = self._started
        self._done = 0

    def start_epoch(self) -> None:
        self._epoch_started = time.monotonic()

    def line(self, epoch: int, record: dict[str, float], rows: float) -> str:
        """The line for ``epoch`` (1-based), whose training took ``rows`` rows over all ranks."""
        now = time.monotonic()
        self._done += 1
        took = max(now - self._epoch_started, 1e-9)
        left = (now - self._started) / self._done * (self.epochs - epoch)
        metrics = [f"{k} {v:.4f}" for k, v in record.items() if k != "epoch"]
        pace = [f"{self.steps} steps", f"{rows / took:,.0f} rows/s", f"eta {_clock(left)}"]
        return "  ".join([f"epoch {epoch}/{self.epochs}", *metrics, *pace])


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
