"""Elastic training with Keras 3 (``hvd.elastic`` of ``import hora.keras as hvd``), on every backend.

As Horovod's ``hvd.elastic`` for Keras::

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [  # the Update callbacks first: a commit at an epoch's end then saves the next epoch's number
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=10),
    ]

    @hvd.elastic.run
    def train(state):
        model.fit(data, epochs=epochs - state.epoch, callbacks=callbacks)

    train(state)

A peer lost inside ``model.fit``'s compiled step reaches :func:`run` as
TensorFlow's or JAX's own error; :func:`hora.elastic.run` recognises it.
One gap with Horovod: Keras 3 cannot shorten an epoch already begun, so after
a reset mid-epoch the epoch runs its full number of steps again
(``state.batch`` says where it had been).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from hora import basics
from hora.elastic import HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from hora.keras.functions import broadcast_variables
from hora.objects import broadcast_object

__all__ = [
    "CommitStateCallback",
    "HostsUpdatedInterrupt",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
    "run_fn",
]


class KerasState(ObjectState):
    """The state of a Keras model and its optimizer, as Horovod's ``KerasState``.

    :meth:`save` copies the values of the model's variables and the
    optimizer's (its slots and iteration count), :meth:`restore` assigns them
    back, :meth:`sync` broadcasts rank 0's. Other keywords are picklable
    attributes, as in :class:`~hora.elastic.ObjectState`.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: the compiled model's); built here if it is not yet.
        **kwargs: more attributes (``epoch=0``, ``batch=0``, ...).

    Raises:
        ValueError: the model is not built, or it has no optimizer.
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, **kwargs: Any) -> None:
        if not model.built:
            raise ValueError("hora.keras.elastic.KerasState: build the model first (call it, or model.build(shape)).")
        optimizer = optimizer or getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("hora.keras.elastic.KerasState: pass optimizer= or compile the model first.")
        if not optimizer.built:  # its slots exist from here on, so every save and restore covers the same variables
            optimizer.build(model.trainable_variables)
        self.model = model
        self.optimizer = optimizer
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved_values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _variables(self) -> list[Any]:
        return [*self.model.variables, *self.optimizer.variables]

    def _save_model(self) -> None:
        # Variable.numpy(), not numpy's conversion: that warns for a TensorFlow variable (numpy's copy keyword).
        self._saved_values = [np.array(v.numpy(), copy=True) for v in self._variables()]


class CommitStateCallback(keras.callbacks.Callback):
    """Commits the state every ``batches_per_commit`` batches and at the end of every epoch.

    Args:
        state: the state to commit.
        batches_per_commit: batches between commits (a commit communicates; more is cheaper, less loses less).
    """

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be a positive integer, got {batches_per_commit!r}.")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the batch the current epoch has reached (0 between epochs)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0  # type: ignore[attr-defined]


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` counting epochs across resets (Keras counts from 0 in every ``fit``)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch  # type: ignore[attr-defined]

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch  # type: ignore[attr-defined]

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # One past the epoch just ended: a reset after it must not repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1  # type: ignore[attr-defined]
