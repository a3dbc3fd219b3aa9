"""How JAX arrays reach Hora's engine: one host callback per group, in program order, inside ``jit`` or not.

Inside a trace a group crosses in one
``jax.experimental.buffer_callback(..., has_side_effect=True)`` on XLA's
own buffers. An elementwise collective (allreduce, broadcast) gets each
result buffer aliased to its input (``input_output_aliases``): the engine
works in place in the input's buffer where XLA can give it up, and where
the input is still needed afterwards (or is a parameter or a constant) XLA
copies it into the result's buffer first, so the program's values never
change. Reducing in place costs no copy at all and, unlike reducing into a
buffer of its own, writes no memory that is not already in cache (the
MLP's two gradients, 2 ranks: 0.6 ms in place against 1.3 ms into other
buffers). Other collectives read XLA's input buffers where they lie and
write the buffers XLA made for the results. An ordered
``io_callback`` copies every input and every result and puts the inputs on
the device again (measured here, 7 MB of gradients: ~4 ms a crossing
against ~0.3 ms). A side-effecting callback is never dropped (a
``pure_callback`` may be), but XLA may run independent ones in any order;
collectives need the program's order on every rank, so each crossing
returns a marker that the next crossing of the same trace takes as an
input (:func:`last_marker`, :func:`continue_from`). The chain stays
within one trace: the crossings in the body of a ``lax.scan``,
``while_loop`` or ``cond`` are ordered among themselves but not against
those around the loop, where XLA orders them by their data, or else the
same way on every rank as long as the ranks run the same program. When a
collective is differentiated the crossing of its gradient (built as JAX
transposes) takes its forward crossing's marker, kept as a residual
(``hora.jax.collectives``): the ranks compile programs of their own
(their constants differ), and without it one rank ran the forward
crossing first and another the gradient's. Outside ``jit`` the host
function simply runs now.

As for TensorFlow, the small arrays of a group are flattened and
concatenated per dtype before they cross (measured here: 50 arrays cost
~1,650 µs as 50 callbacks, ~260 µs concatenated into one) and split after;
large ones cross as they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import get_opaque_trace_state

__all__ = ["check_array", "check_arrays", "continue_from", "cross", "cross_packed", "last_marker", "tracing"]

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
    """Runs ``host(*arrays)`` on the host values of ``inputs`` and returns its arrays.

    ``outputs`` gives the shape and dtype of each array ``host`` returns; inside
    a trace they are copied into the buffers XLA gave the results.
    """

    def run(arrays: list[np.ndarray], buffers: list[np.ndarray]) -> None:
        for result, buffer in zip(host(*arrays), buffers, strict=True):
            if result.shape != buffer.shape:
                raise ValueError(
                    f"hora.jax: the engine returned shape {result.shape} where {buffer.shape} was traced; a "
                    "collective's shapes must not change between traces on one rank and not on another."
                )
            np.copyto(buffer, result, casting="unsafe")

    if not tracing(inputs):
        # Outside any trace: run now. A callback here would compile a computation per call (~16 ms).
        results = host(*[np.asarray(a) for a in inputs])
        return [jnp.asarray(np.asarray(r, dtype=o.dtype)) for r, o in zip(results, outputs, strict=True)]
    return _call_host(run, inputs, outputs)


_MARKER = jax.ShapeDtypeStruct((), np.uint8)


class _Order(threading.local):
    """The marker of the last crossing built on this thread and the trace it belongs to.

    Holding the marker keeps its trace alive until this thread builds a crossing in another one.
    """

    trace: Any = None
    marker: Any = None


_ORDER = _Order()


def last_marker() -> Any:
    """The marker of the last crossing built in the trace being built now, or None."""
    return _ORDER.marker if _ORDER.trace is not None and _ORDER.trace == get_opaque_trace_state() else None


def continue_from(marker: Any) -> None:
    """The next crossing built in the trace being built now runs after the one ``marker`` came from."""
    _ORDER.trace, _ORDER.marker = get_opaque_trace_state(), marker


def _call_host(run: Callable[[list[np.ndarray], list[np.ndarray]], None], inputs: Sequence[jax.Array],
               outputs: Sequence[jax.ShapeDtypeStruct], *, in_place: bool = False) -> list[jax.Array]:  # fmt: skip
    """Inside a trace: ``run(inputs, outputs)`` on XLA's own buffers, the inputs' (only read) and those it made
    for the results (which ``run`` fills), after the trace's previous crossing (see the module's docstring).

    With ``in_place`` output i is input i's buffer (of its shape and dtype),
    holding input i's values when ``run(outputs, outputs)`` works on it.
    """
    previous = last_marker()
    count = len(inputs)

    def callback(context: Any, buffers: tuple[Any, ...], *arrays: Any) -> None:
        *into, marker = buffers
        results = [np.asarray(b) for b in into]
        if in_place:
            run(results, results)
        else:
            views = [np.asarray(a) for a in arrays[:count]]  # arrays[count], if any, is the previous marker
            for view in views:  # XLA's inputs (a parameter, a constant) must come back as they were
                view.flags.writeable = False
            run(views, results)
        np.asarray(marker)[...] = 0

    extra = () if previous is None else (previous,)
    aliases = {i: i for i in range(count)} if in_place else None
    call = buffer_callback(callback, (*outputs, _MARKER), has_side_effect=True, input_output_aliases=aliases)
    *results, marker = call(*inputs, *extra)
    continue_from(marker)
    return results


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

    ``run(inputs, outputs)`` writes the collective's result into each output.
    Inside a trace each output is its input's own buffer, holding the input
    (``inputs is outputs``: the collective works in place; see the module's
    docstring). Outside, the inputs are JAX's read-only host arrays and the
    outputs buffers of this layer's: with ``reads_inputs`` (an allreduce)
    the collective only reads the inputs; otherwise each output starts as a
    copy of its input and is the input too. Returns one array per input, of
    its shape and dtype.
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
    # A large array crosses as it is: flattened, it would be a bitcast of its producer's buffer, which XLA copies
    # into the aliased result instead of handing the buffer over (a dot's output, as most gradients are, cannot
    # take the copy into its own kernel). The small ones of a dtype (their list in `small`) are concatenated.
    flats = [jnp.concatenate([jnp.ravel(arrays[i]) for i in pack]) if pack is small.get(arrays[pack[0]].dtype)
             else arrays[pack[0]] for pack in packs]  # fmt: skip

    if tracing(flats):
        shapes = [jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flats]
        packed_results = _call_host(run, flats, shapes, in_place=True)
    else:
        hosts = [np.asarray(f) for f in flats]
        buffers = [np.empty_like(h) for h in hosts]
        if not reads_inputs:
            for buffer, host in zip(buffers, hosts, strict=True):
                np.copyto(buffer, host)
        run(hosts if reads_inputs else buffers, buffers)
        packed_results = [jnp.asarray(b) for b in buffers]

    results: list[Any] = [None] * len(arrays)
    for pack, packed in zip(packs, packed_results, strict=True):
        sizes = np.cumsum([arrays[i].size for i in pack])[:-1].tolist()
        pieces = jnp.split(packed, sizes) if len(pack) > 1 else [packed]
        for i, piece in zip(pack, pieces, strict=True):
            results[i] = piece.reshape(arrays[i].shape)
    return results
