"""``SyncBatchNormalization``: Keras batch normalization whose training statistics span every rank's batch."""

from __future__ import annotations

from typing import Any

import keras
from hora.ops import Sum
from hora.process_sets import global_process_set
from keras import ops

__all__ = ["SyncBatchNormalization"]


def _sum_over_ranks(tensor: Any) -> Any:
    """The differentiable sum of ``tensor`` over every rank, with the adapter of Keras's backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from hora.tensorflow.collectives import allreduce
    elif backend == "jax":
        from hora.jax.collectives import allreduce
    elif backend == "torch":
        from hora.torch.differentiable import allreduce
    else:
        raise NotImplementedError(f"hora.keras.SyncBatchNormalization does not support Keras's {backend!r} backend.")
    return allreduce(tensor, op=Sum)


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization that, in training, normalizes with the mean and variance of the global batch.

    Each rank computes its batch's count, mean and mean of squares; one
    differentiable allreduce sums them (weighted by the counts, so ranks may
    hold batches of different sizes; with equal batches this is Horovod's
    formula), and the variance is ``E[x²] - E[x]²`` over all ranks. Gradients
    flow through the allreduce, so they too are those of the global batch.
    Inference uses the moving statistics, which every rank updates with the
    same global values. Every Keras backend.

    Args:
        fused: must be False (accepted for Horovod compatibility).
        **kwargs: as ``keras.layers.BatchNormalization``.
    """

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError(f"SyncBatchNormalization does not support fused={fused}; pass fused=False.")
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(inputs, mask)
        if global_process_set.size() == 1:
            return mean, variance
        if mask is None:
            count = ops.cast(ops.size(inputs) // ops.size(mean), mean.dtype)
        else:
            count = ops.sum(ops.cast(mask, mean.dtype))
        counts = ops.broadcast_to(count, ops.shape(mean))
        local = ops.stack([mean * count, (variance + ops.square(mean)) * count, counts])
        total_mean, total_square, total_count = ops.unstack(_sum_over_ranks(local))
        global_mean = total_mean / total_count
        # E[x²] - E[x]² can come out a rounding error below zero for a constant feature
        return global_mean, ops.maximum(total_square / total_count - ops.square(global_mean), 0.0)
