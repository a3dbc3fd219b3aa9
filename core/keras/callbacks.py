"""Horovod's Keras callbacks on the public Keras 3 API, for every backend.

Callbacks run eagerly between steps, so they exchange numpy values through
Hora's numpy API whatever the backend: a variable's value is read, broadcast
or averaged on the host, and assigned back.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from hora import basics, ops
from hora.keras.functions import broadcast_variables

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's and the optimizer's variables from ``root_rank`` when training begins.

    Keras builds the optimizer before ``on_train_begin``, so its state (Adam's
    moments, the iteration count) is broadcast too, and every rank starts
    identical, whether the weights were initialised randomly or restored.
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device  # accepted for Horovod compatibility
        self.broadcast_done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        check_loss_scaling(self.model.optimizer)
        if self.broadcast_done:
            return
        variables = list(self.model.variables)
        if self.model.optimizer is not None:
            variables += list(self.model.optimizer.variables)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics in ``logs`` by their average over the ranks.

    Put it before the callbacks that read the metrics (checkpointing, early
    stopping, logging), so they see the global values on every rank.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device  # accepted for Horovod compatibility

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        names = sorted(name for name, value in logs.items() if np.ndim(value) == 0 and _is_number(value))
        values = np.array([float(np.asarray(logs[name])) for name in names], dtype=np.float64)
        averaged = ops.allreduce(values, name=f"keras.metrics.{epoch}", op=ops.Average)
        for name, value in zip(names, averaged.tolist(), strict=True):
            logs[name] = value


def check_loss_scaling(optimizer: Any) -> None:
    """Raises when a LossScaleOptimizer wraps a DistributedOptimizer (it must be the other way round).

    ``compile`` wraps the optimizer so when the *model's* dtype policy is
    mixed_float16 but the global one was not when the optimizer was made
    distributed. Its finite check would then run before the exchange: a rank
    whose gradients overflowed would skip the collective and leave the
    others waiting.
    """
    from hora.keras.optimizer import is_distributed

    scaler = isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and not is_distributed(optimizer)
    if scaler and is_distributed(optimizer.inner_optimizer):
        raise ValueError(
            "A LossScaleOptimizer wraps a hora DistributedOptimizer, so a rank whose gradients overflow would "
            "skip the exchange and leave the others waiting. Set the mixed_float16 policy before calling "
            "DistributedOptimizer (keras.config.set_dtype_policy('mixed_float16')), or pass "
            "DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))."
        )


def _is_number(value: Any) -> bool:
    try:
        float(np.asarray(value))
    except (TypeError, ValueError):
        return False
    return True


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` between ``start_epoch`` and ``end_epoch``.

    Args:
        initial_lr: the learning rate the multiplier scales (default: the
            optimizer's when training begins).
        multiplier: a constant, or a function of the epoch (a float when not
            ``staircase``: epoch + fraction of the epoch done).
        start_epoch, end_epoch: the epochs to adjust (end exclusive; None: to the end).
        staircase: adjust once per epoch (True) or at every batch.
        momentum_correction: scale an SGD momentum by new_lr / old_lr while the
            rate changes (Goyal et al.). Keras 3 compiles the momentum into the
            TensorFlow and JAX training steps as a constant, so it takes effect
            on the torch backend only (a warning says so elsewhere).
        steps_per_epoch: batches per epoch (default: from ``fit``'s parameters).
    """

    def __init__(
        self,
        initial_lr: float | None = None,
        multiplier: float | Callable[[float], float] = 1.0,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase if callable(multiplier) else True
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum: float | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _learning_rate(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    f"{type(self).__name__} could not tell the number of steps per epoch from fit(); "
                    "pass steps_per_epoch=."
                )
        compiled = keras.backend.backend() != "torch"
        if self.momentum_correction and hasattr(self.model.optimizer, "momentum") and compiled:
            warnings.warn(
                f"{type(self).__name__}: momentum correction has no effect on Keras's "
                f"{keras.backend.backend()} backend, which compiles the momentum into the training step; "
                "pass momentum_correction=False to silence this.",
                stacklevel=2,
            )
            self.momentum_correction = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + batch / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._restore_momentum is not None:
            self.model.optimizer.momentum = self._restore_momentum
            self._restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = _learning_rate(self.model.optimizer)

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old = _learning_rate(optimizer)
        new = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new
        if self.momentum_correction and hasattr(optimizer, "momentum") and old:
            self._restore_momentum = optimizer.momentum
            optimizer.momentum = self._restore_momentum * new / old


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.).

    At fractional epoch ``e`` (counted at every batch) the rate is
    ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)``, Horovod's
    formula, so a rate scaled by the number of ranks is reached gradually.
    """

    def __init__(
        self,
        initial_lr: float | None = None,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(
            initial_lr, self._warmup, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
            momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
        )  # fmt: skip
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def _warmup(self, epoch: float) -> float:
        size = basics.size()
        epoch += 1.0 / self.steps_per_epoch  # round numbers at the end of each epoch, as Horovod
        return 1.0 / size * (epoch * (size - 1) / self.warmup_epochs + 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            rate = _learning_rate(self.model.optimizer)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {rate:g}.")


def _learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
