"""``DistributedOptimizer`` for TensorFlow: Keras optimizers (via ``hora.keras``) and ``tf.compat.v1`` ones.

Horovod's ``horovod.tensorflow.DistributedOptimizer`` takes either kind; so
does this. A ``tf.compat.v1.train.Optimizer`` is wrapped so that
``compute_gradients`` (and so ``minimize``) returns gradients averaged
across ranks, for graph-mode scripts run in sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from hora.compression import Compression, Compressor
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set
from hora.tensorflow.gradients import GradientExchange

__all__ = ["DistributedOptimizer"]


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1`` optimizer whose ``compute_gradients`` averages the gradients across ranks."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: str | None, use_locking: bool,
                 exchange: GradientExchange) -> None:  # fmt: skip
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._exchange = exchange

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's ``(gradient, variable)`` pairs, the gradients averaged across ranks."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs, strict=True)
        return list(zip(self._exchange(list(grads), list(variables)), variables, strict=True))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> list[str]:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(  # noqa: N802 - Horovod's name for it
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Returns ``optimizer`` as one whose gradients are averaged across ranks before they are applied.

    A Keras optimizer goes to :func:`hora.keras.DistributedOptimizer`; a
    ``tf.compat.v1.train.Optimizer`` is wrapped for graph-mode training
    (``minimize`` / ``compute_gradients``). Arguments as in Horovod; the
    device arguments are accepted and unused; ``backward_passes_per_step``
    accumulates for Keras optimizers and must be 1 for ``tf.compat.v1`` ones.
    """
    common = {
        "compression": compression, "sparse_as_dense": sparse_as_dense, "op": op,
        "gradient_predivide_factor": gradient_predivide_factor, "num_groups": num_groups, "groups": groups,
        "process_set": process_set,
    }  # fmt: skip
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from hora.keras import optimizer as keras_optimizer

        return keras_optimizer.DistributedOptimizer(
            optimizer, name=name, backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, **common,
        )  # fmt: skip
    if backward_passes_per_step != 1:
        raise ValueError(
            f"hora.tensorflow.DistributedOptimizer: backward_passes_per_step={backward_passes_per_step} is not "
            "supported for tf.compat.v1 optimizers; accumulate the gradients yourself and minimize every N steps."
        )
    exchange = GradientExchange(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups if groups is not None else num_groups,
        process_set=process_set, caller="tensorflow.DistributedOptimizer",
    )  # fmt: skip
    return _DistributedV1Optimizer(optimizer, name, use_locking, exchange)
