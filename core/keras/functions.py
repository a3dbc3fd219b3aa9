"""Collectives on Keras values, for every backend: through the host, as numpy arrays (eagerly)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
from hora import _forms, ops
from hora.compression import Compression, Compressor
from hora.ops import _NUMPY
from hora.process_sets import ProcessSet, global_process_set

__all__ = ["allgather", "allreduce", "broadcast", "broadcast_global_variables", "broadcast_variables"]


_SIGNED_OF = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32, np.dtype(np.uint64): np.int64}


def _array(value: Any) -> np.ndarray:
    """``value``'s values in a C-contiguous array of its own (scalars stay 0-d)."""
    # A variable through its own numpy(): numpy's conversion of a TensorFlow variable warns (the copy keyword).
    values = value.numpy() if isinstance(value, keras.Variable) else keras.ops.convert_to_numpy(value)
    return np.array(values, order="C", copy=True)


def broadcast_variables(variables: Iterable[Any], root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Assigns every variable ``root_rank``'s value (one call into the engine for all of them); eager only."""
    variables = list(variables)
    if not variables:
        return
    values = [_array(v) for v in variables]
    # A broadcast only moves bytes: unsigned types the engine does not reduce (a seed generator's uint32
    # state on JAX) travel as the signed type of their width, through a view of the same memory.
    moved = [a.view(_SIGNED_OF[a.dtype]) if a.dtype in _SIGNED_OF else a for a in values]
    _forms.call(_forms.BROADCAST, moved, adapter=_NUMPY, grouped=True, in_place=True, wait=True, name=None,
                process_set=process_set, root_rank=root_rank)  # fmt: skip
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TensorFlow 1 call; Keras 3 has no global variables.

    Raises:
        RuntimeError: always; broadcast ``model.variables`` (and the
            optimizer's) with :func:`broadcast_variables`, or use
            ``BroadcastGlobalVariablesCallback``.
    """
    raise RuntimeError(
        "hora.keras.broadcast_global_variables: Keras 3 has no global variables. Use "
        "hora.keras.broadcast_variables(model.variables, root_rank) or BroadcastGlobalVariablesCallback(root_rank)."
    )


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Compressor = Compression.none,
) -> np.ndarray:
    """The reduction of ``value`` (a Keras tensor, variable or array) across ranks, as a numpy array."""
    op = _forms.horovod_op(op, average, "keras.allreduce")
    compressed, ctx = compression.compress(_array(value))
    reduced = ops.allreduce(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def allgather(value: Any, name: str | None = None) -> np.ndarray:
    """Every rank's ``value`` concatenated along the first dimension, as a numpy array."""
    return ops.allgather(_array(value), name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """``root_rank``'s ``value``, as a numpy array."""
    return ops.broadcast(_array(value), root_rank, name)
