"""Gradient averaging for JAX training loops: an optax-style transformation, and the exchange Keras uses.

``allreduce_gradients()`` is a gradient transformation in optax's shape (an
``init`` and an ``update`` function), so it chains in front of any optax
optimizer::

    optimizer = optax.chain(hvd.allreduce_gradients(), optax.adam(1e-3))

Inside ``jit`` the gradients of a step cross to the engine once (one ordered
host callback, small ones packed per dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from hora import _gradients
from hora.compression import Compression, Compressor, TensorHooks, register_tensor_hooks
from hora.jax.collectives import grouped_allreduce
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set

__all__ = ["GradientExchange", "GradientTransformation", "allreduce_gradients"]

_HOOKS = TensorHooks(
    is_floating=lambda a: jax.numpy.issubdtype(a.dtype, jax.numpy.floating),
    dtype=lambda a: a.dtype,
    cast=lambda a, dtype: a.astype(jax.numpy.float16 if dtype == "float16" else dtype),
)
register_tensor_hooks(jax.Array, _HOOKS)
register_tensor_hooks(jax.core.Tracer, _HOOKS)  # inside jit and grad the values are tracers, not jax.Arrays


class GradientExchange(_gradients.GradientExchange):
    """Combines a step's JAX gradients across ranks (see :class:`hora._gradients.GradientExchange`)."""

    def reduce(self, grads: list[Any]) -> list[Any]:
        packed = [self.compression.compress(g) for g in grads]
        reduced = grouped_allreduce(
            [c for c, _ in packed], op=self.op, prescale_factor=self.prescale, postscale_factor=self.postscale,
            process_set=self.process_set,
        )  # fmt: skip
        return [self.compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed, strict=True)]


class GradientTransformation(NamedTuple):
    """optax's ``GradientTransformation`` shape: ``init(params) -> state``, ``update(updates, state, params)``."""

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]


def allreduce_gradients(
    op: Any = Average,
    compression: Compressor = Compression.none,
    gradient_predivide_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> GradientTransformation:
    """A gradient transformation that averages (or sums, ...) the updates pytree across ranks.

    Args:
        op: hora.Average (default), Sum, Min, Max or Product.
        compression: ``Compression.fp16`` sends floating-point gradients as float16.
        gradient_predivide_factor: with Average, divide by this before the sum
            and by ``size / factor`` after it.
        process_set: the ranks that exchange gradients.
    """
    exchange = GradientExchange(
        compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
        process_set=process_set, caller="jax.allreduce_gradients",
    )  # fmt: skip

    def init(params: Any) -> tuple[()]:
        return ()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        leaves, structure = jax.tree_util.tree_flatten(updates)
        return jax.tree_util.tree_unflatten(structure, exchange(leaves)), state

    return GradientTransformation(init, update)
