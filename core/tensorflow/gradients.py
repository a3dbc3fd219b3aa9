"""The gradient exchange of ``hora._gradients`` on TensorFlow tensors (used by the tape and by Keras).

A group of gradients is one ``grouped_allreduce``: one crossing to the engine,
``tf.IndexedSlices`` allgathered in the same call unless ``sparse_as_dense``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from hora import _gradients
from hora.tensorflow.collectives import grouped_allreduce

__all__ = ["GradientExchange"]


class GradientExchange(_gradients.GradientExchange):
    """Combines a step's TensorFlow gradients across ranks (see :class:`hora._gradients.GradientExchange`)."""

    def reduce(self, grads: list[Any]) -> list[Any]:
        return grouped_allreduce(
            grads, compression=self.compression, op=self.op, prescale_factor=self.prescale,
            postscale_factor=self.postscale, process_set=self.process_set,
        )  # fmt: skip

    def densify(self, grad: Any) -> Any:
        return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad

    @tf.autograph.experimental.do_not_convert
    def __call__(self, grads: Sequence[Any], variables: Sequence[Any] | None = None) -> list[Any]:
        return super().__call__(grads, variables)
