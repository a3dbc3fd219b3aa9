"""``SyncBatchNormalization``: Keras batch normalization whose training statistics span every rank's batch."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from hora.ops import Sum
from hora.process_sets import global_process_set
from hora.tensorflow.collectives import allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization that, in training, normalizes with the mean and variance of the global batch.

    Each rank computes its batch's count, mean and mean of squares; one
    differentiable allreduce sums them (weighted by the counts, so ranks may
    hold batches of different sizes; with equal batches this is Horovod's
    formula), and the variance is ``E[x²] - E[x]²`` over all ranks. Gradients
    flow through the allreduce, so they too are those of the global batch.
    Inference uses the moving statistics, which every rank updates with the
    same global values. Keras 3 with the TensorFlow backend.

    Args:
        fused: must be False (accepted for Horovod compatibility).
        **kwargs: as ``keras.layers.BatchNormalization``.
    """

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError(f"SyncBatchNormalization does not support fused={fused}; pass fused=False.")
        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "hora.tensorflow.SyncBatchNormalization needs Keras's TensorFlow backend, got "
                f"{keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow."
            )
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)

    def _moments(self, inputs: tf.Tensor, mask: Any) -> tuple[tf.Tensor, tf.Tensor]:
        mean, variance = super()._moments(inputs, mask)
        if global_process_set.size() == 1:
            return mean, variance
        if mask is None:
            count = tf.cast(tf.size(inputs) // tf.size(mean), mean.dtype)
        else:
            count = tf.reduce_sum(tf.cast(mask, mean.dtype))
        local = tf.stack([mean * count, (variance + tf.square(mean)) * count, tf.broadcast_to(count, tf.shape(mean))])
        total_mean, total_square, total_count = tf.unstack(allreduce(local, op=Sum))
        global_mean = total_mean / total_count
        return global_mean, total_square / total_count - tf.square(global_mean)
