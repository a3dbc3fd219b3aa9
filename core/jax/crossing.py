"""How JAX arrays reach Hora's engine: one ordered ``io_callback`` per group, inside ``jit`` or not.

JAX compiles a traced function as a whole and may drop or reorder a
``pure_callback`` whose result looks unused (measured here: one ran 0
times); ``io_callback(..., ordered=True)`` is never dropped and runs in
program order, which is what collectives need (every rank the same
sequence). Outside ``jit`` the same callback simply runs now.

As for TensorFlow, the small arrays of a group are flattened and
concatenated per dtype before they cross (measured here: 50 arrays cost
~1,650 µs as 50 callbacks, ~260 µs concatenated into one) and split after;
large ones cross as they are. JAX hands the callback read-only host
arrays, so the engine reduces into copies, which become the results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_array", "check_arrays", "cross", "cross_packed", "tracing"]

# An array this large crosses on its own; smaller ones are concatenated per dtype (see hora.tensorflow.crossing).
RUNS_ALONE_BYTES = 256 * 1024

SUPPORTED_DTYPES = tuple(
    np.dtype(d)
    for d in ("uint8", "int8", "int16", "int32", "int64", "float16", jnp.bfloat16, "float32", "float64", "bool")
)
_SUPPORTED_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)


def check_array(value: object, caller: str, min_dims: int = 0) -> jax.Array:
    """``value`` as a JAX array of a dtype the engine supports; raises, quoting it, otherwise."""
    try:
        array = jnp.asarray(value)
    except TypeError as error:
        raise TypeError(f"hora.jax.{caller} expects a JAX array, got {type(value).__name__}: {error}") from error
    if np.dtype(array.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(
            f"hora.jax.{caller} does not support dtype {array.dtype}; supported dtypes: {_SUPPORTED_NAMES}."
        )
    if array.ndim < min_dims:
        raise ValueError(f"hora.jax.{caller} needs arrays with at least one dimension; got a scalar.")
    return array


def check_arrays(values: object, caller: str, min_dims: int = 0) -> list[jax.Array]:
    """The arrays of a grouped call, each checked by :func:`check_array`."""
    if isinstance(values, (jax.Array, np.ndarray)) or not isinstance(values, Sequence):
        raise TypeError(f"hora.jax.{caller} expects a list of arrays, got {type(values).__name__}.")
    return [check_array(v, caller, min_dims) for v in values]


def cross(host: Callable[..., Sequence[np.ndarray]], inputs: Sequence[jax.Array],
          outputs: Sequence[jax.ShapeDtypeStruct]) -> list[jax.Array]:  # fmt: skip
    """Runs ``host(*arrays)`` on the host values of ``inputs`` (in program order) and returns its arrays.

    ``outputs`` gives the shape and dtype of each array ``host`` returns.
    """

    def callback(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        results = host(*[np.asarray(a) for a in arrays])
        for result, output in zip(results, outputs, strict=True):
            if result.shape != output.shape:
                raise ValueError(
                    f"hora.jax: the engine returned shape {result.shape} where {output.shape} was traced; a "
                    "collective's shapes must not change between traces on one rank and not on another."
                )
        return tuple(np.asarray(r, dtype=o.dtype) for r, o in zip(results, outputs, strict=True))

    if not tracing(inputs):
        # Outside any trace: run now. An io_callback here would compile a computation per call (~16 ms).
        return [jnp.asarray(r) for r in callback(*[np.asarray(a) for a in inputs])]
    return list(jax.experimental.io_callback(callback, tuple(outputs), *inputs, ordered=True))


def tracing(arrays: Sequence[Any]) -> bool:
    """Whether any of ``arrays`` is being traced (by jit, grad, vmap, ...)."""
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def cross_packed(
    run: Callable[[list[np.ndarray], list[np.ndarray]], None],
    arrays: Sequence[jax.Array],
    *,
    reads_inputs: bool = False,
) -> list[jax.Array]:
    """Runs an elementwise collective over ``arrays`` in one crossing, small arrays packed per dtype.

    ``run(inputs, outputs)`` writes the collective's result into each output,
    a host buffer of its own. With ``reads_inputs`` (an allreduce) the inputs
    are JAX's read-only host arrays, which the collective only reads;
    otherwise each output starts as a copy of its input and is the input
    too. Returns one array per input, of its shape and dtype.
    """
    packs: list[list[int]] = []
    small: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        if a.size * a.dtype.itemsize >= RUNS_ALONE_BYTES:
            packs.append([i])
        elif a.dtype in small:
            small[a.dtype].append(i)
        else:
            small[a.dtype] = [i]
            packs.append(small[a.dtype])
    flats = [jnp.concatenate([jnp.ravel(arrays[i]) for i in pack]) if len(pack) > 1 else jnp.ravel(arrays[pack[0]])
             for pack in packs]  # fmt: skip

    def host(*buffers: np.ndarray) -> list[np.ndarray]:
        if reads_inputs:
            outputs = [np.empty_like(b) for b in buffers]
            run(list(buffers), outputs)
        else:
            outputs = [np.array(b, copy=True) for b in buffers]  # JAX's host arrays are read-only
            run(outputs, outputs)
        return outputs

    results: list[Any] = [None] * len(arrays)
    outputs = cross(host, flats, [jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flats])
    for pack, packed in zip(packs, outputs, strict=True):
        sizes = np.cumsum([arrays[i].size for i in pack])[:-1].tolist()
        pieces = jnp.split(packed, sizes) if len(pack) > 1 else [packed]
        for i, piece in zip(pack, pieces, strict=True):
            results[i] = piece.reshape(arrays[i].shape)
    return results
