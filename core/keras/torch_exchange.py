"""The gradient exchange of ``hora._gradients`` on torch tensors, for Keras's torch backend.

Keras's torch trainer applies the parameters' ``.grad`` tensors eagerly; a
group of them is reduced in place in one call into the engine.
"""

from __future__ import annotations

from typing import Any

from hora import _gradients
from hora.handles import synchronize
from hora.torch.collectives import grouped_allreduce_async_

__all__ = ["TorchGradientExchange"]


class TorchGradientExchange(_gradients.GradientExchange):
    """Combines a step's torch gradients across ranks (see :class:`hora._gradients.GradientExchange`)."""

    def reduce(self, grads: list[Any]) -> list[Any]:
        packed = [self.compression.compress(g.detach()) for g in grads]
        handle = grouped_allreduce_async_(
            [c for c, _ in packed], op=self.op, prescale_factor=self.prescale, postscale_factor=self.postscale,
            process_set=self.process_set,
        )  # fmt: skip
        reduced = synchronize(handle)
        return [self.compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed, strict=True)]

    def densify(self, grad: Any) -> Any:
        return grad.to_dense() if grad is not None and grad.is_sparse else grad
