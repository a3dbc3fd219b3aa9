"""Horovod-style collectives on JAX arrays, with gradients, inside ``jit`` and out.

Each collective is the request layer's (``hora._forms``, on numpy buffers)
reached through :mod:`hora.jax.crossing`: a group of arrays crosses to the
engine in one ordered host callback. The gradients (``jax.custom_vjp``) are
Horovod's, as in ``hora.torch`` and ``hora.tensorflow``: allreduce of the
cotangent (same op and scale factors) for allreduce; this rank's rows of the
averaged cotangent for allgather; the averaged cotangent on the root (zeros
elsewhere) for broadcast; the gathered cotangent, scaled as Horovod scales
it, for reducescatter. Only Sum and Average have gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hora import _forms
from hora._arrays import alltoall_rows, check_root
from hora.basics import current_job
from hora.jax.crossing import check_array, check_arrays, continue_from, cross, cross_packed, last_marker, tracing
from hora.ops import _NUMPY, Average, host_group
from hora.process_sets import ProcessSet, global_process_set, set_id

__all__ = [
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "reducescatter",
]

_ALLREDUCE, _ALLGATHER, _BROADCAST, _REDUCESCATTER, _ALLTOALL = (
    _forms.ALLREDUCE, _forms.ALLGATHER, _forms.BROADCAST, _forms.REDUCESCATTER, _forms.ALLTOALL,
)  # fmt: skip


def _checked_set(process_set: ProcessSet, caller: str) -> ProcessSet:
    set_id(process_set, f"jax.{caller}")
    return process_set


def _floating(array: jax.Array) -> bool:
    return jnp.issubdtype(array.dtype, jnp.floating)


def _zero_cotangent(array: jax.Array) -> np.ndarray:
    """The cotangent JAX expects for a non-differentiable (integer or bool) input."""
    return np.zeros(array.shape, dtype=jax.dtypes.float0)


def _differentiable(forward: Any, backward: Any, arrays: list[jax.Array]) -> list[jax.Array]:
    """``forward(arrays)`` with ``backward(arrays, outputs, cotangents)`` as its vector-Jacobian product.

    ``backward`` sees only the floating-point positions; the others get zero cotangents.
    """
    floating = [i for i, a in enumerate(arrays) if _floating(a)]
    if not floating or not tracing(arrays):  # concrete values are not being differentiated
        return forward(arrays)

    # custom_vjp traces forward apart from the caller's trace: the marker that keeps crossings in program order
    # (hora.jax.crossing) goes in and comes out as an argument and a result.
    @jax.custom_vjp
    def run(xs: tuple[jax.Array, ...], after: jax.Array) -> tuple[tuple[jax.Array, ...], jax.Array]:
        continue_from(after)
        ys = tuple(forward(list(xs)))
        return ys, last_marker()

    def run_forward(xs: tuple[jax.Array, ...], after: jax.Array) -> tuple[Any, tuple[Any, ...]]:
        ys, marker = run(xs, after)
        return (ys, marker), (xs, marker)

    def run_backward(residuals: tuple[Any, ...], output_cotangents: tuple[Any, Any]) -> tuple[tuple[Any, ...], Any]:
        xs, forward_marker = residuals
        cotangents, _ = output_cotangents  # the marker's is a float0 zero
        # The gradient's crossing runs after this collective's forward crossing and after the crossings of the
        # backward pass built before it: without the first, XLA may run the two in either order, and the ranks
        # may differ (each compiles its own program, with its own constants), pairing one rank's forward
        # crossing with another's gradient crossing.
        previous = last_marker()
        continue_from(forward_marker if previous is None else jnp.maximum(forward_marker, previous))
        grads = backward([xs[i] for i in floating], [cotangents[i] for i in floating])
        result: list[Any] = [_zero_cotangent(x) for x in xs]
        for i, g in zip(floating, grads, strict=True):
            result[i] = g
        return tuple(result), np.zeros((), dtype=jax.dtypes.float0)

    run.defvjp(run_forward, run_backward)
    after = last_marker()
    ys, marker = run(tuple(arrays), np.uint8(0) if after is None else after)
    continue_from(marker)
    return list(ys)


# --- allreduce -------------------------------------------------------------------------------


def _allreduce_group(arrays: list[jax.Array], name: str | None, op: Any, pre: float, post: float,
                     process_set: ProcessSet, caller: str) -> list[jax.Array]:  # fmt: skip
    def forward(xs: list[jax.Array]) -> list[jax.Array]:
        return cross_packed(
            lambda inputs, outputs: host_group(_ALLREDUCE, inputs, in_place=True, outputs=outputs, name=name, op=op,
                                               prescale_factor=pre, postscale_factor=post, process_set=process_set),
            xs, reads_inputs=True,
        )  # fmt: skip

    def backward(xs: list[jax.Array], cotangents: list[jax.Array]) -> list[jax.Array]:
        _forms.check_differentiable(op, f"jax.{caller}")
        return _allreduce_group(cotangents, None, op, pre, post, process_set, caller)

    return _differentiable(forward, backward, arrays)


def allreduce(
    tensor: Any,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> jax.Array:
    """Returns the reduction of ``tensor`` across the ranks of ``process_set``; differentiable, jit-able.

    Args:
        tensor: a JAX array, the same shape and dtype on every rank.
        average: Horovod's older spelling of ``op``: True for Average, False for Sum.
        name: matched across ranks (default: an automatic name).
        op: hora.Average (default), Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks that take part (default: all).
    """
    op = _forms.horovod_op(op, average, "jax.allreduce")
    process_set = _checked_set(process_set, "allreduce")
    array = check_array(tensor, "allreduce")
    return _allreduce_group([array], name, op, float(prescale_factor), float(postscale_factor), process_set,
                            "allreduce")[0]  # fmt: skip


def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[jax.Array]:
    """Returns the reductions of ``tensors``, computed as one unit (one crossing); differentiable."""
    op = _forms.horovod_op(op, average, "jax.grouped_allreduce")
    process_set = _checked_set(process_set, "grouped_allreduce")
    arrays = check_arrays(tensors, "grouped_allreduce")
    if not arrays:
        return []
    return _allreduce_group(arrays, name, op, float(prescale_factor), float(postscale_factor), process_set,
                            "grouped_allreduce")  # fmt: skip


# --- allgather -------------------------------------------------------------------------------


def _allgather_group(arrays: list[jax.Array], name: str | None, process_set: ProcessSet,
                     caller: str) -> list[jax.Array]:  # fmt: skip
    # The output's first dimension is the sum of every member's, known only to the engine: JAX needs every
    # shape when it traces, so the first dimensions are gathered first, outside any trace.
    rows = _rows_of_every_member(arrays, process_set, caller)

    def forward(xs: list[jax.Array]) -> list[jax.Array]:
        outputs = [jax.ShapeDtypeStruct((sum(r), *x.shape[1:]), x.dtype) for x, r in zip(xs, rows, strict=True)]
        return cross(
            lambda *buffers: host_group(_ALLGATHER, list(buffers), in_place=False, name=name, process_set=process_set),
            xs, outputs,
        )  # fmt: skip

    def backward(xs: list[jax.Array], cotangents: list[jax.Array]) -> list[jax.Array]:
        # This rank's rows of the averaged cotangent, as in Horovod.
        averaged = _allreduce_group(cotangents, None, Average, 1.0, 1.0, process_set, caller)
        member = process_set.rank()
        floating = [r for x, r in zip(arrays, rows, strict=True) if _floating(x)]
        return [g[sum(r[:member]) : sum(r[: member + 1])] for g, r in zip(averaged, floating, strict=True)]

    return _differentiable(forward, backward, arrays)


def _rows_of_every_member(arrays: list[jax.Array], process_set: ProcessSet, caller: str) -> list[list[int]]:
    """For each array, every member's first dimension (from the static shapes: exchanged once, on the host)."""
    mine = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    # Named apart from every data request: were ranks to trace differently, the mismatch is reported, not
    # matched against another rank's data.
    every = host_group(_ALLGATHER, [mine], in_place=False, name=f"jax.shapes.{caller}", process_set=process_set)[0]
    return [every[i :: len(arrays)].tolist() for i in range(len(arrays))]


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> jax.Array:
    """Returns every rank's ``tensor`` concatenated along the first dimension, in rank order; differentiable.

    The first dimension may differ between ranks; the others, and the dtype,
    must match. Under ``jit`` the members' first dimensions are exchanged
    when the function is traced (shapes are static in JAX).
    """
    process_set = _checked_set(process_set, "allgather")
    return _allgather_group([check_array(tensor, "allgather", 1)], name, process_set, "allgather")[0]


def grouped_allgather(
    tensors: Sequence[Any], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[jax.Array]:
    """Returns the allgather of every array of ``tensors``, computed as one unit; differentiable."""
    process_set = _checked_set(process_set, "grouped_allgather")
    arrays = check_arrays(tensors, "grouped_allgather", 1)
    return _allgather_group(arrays, name, process_set, "grouped_allgather") if arrays else []


# --- broadcast -------------------------------------------------------------------------------


def broadcast_group(arrays: list[jax.Array], root_rank: int, name: str | None, process_set: ProcessSet,
                    caller: str) -> list[jax.Array]:  # fmt: skip
    """``root_rank``'s values of ``arrays`` on every rank, as one unit (one crossing); differentiable."""

    def forward(xs: list[jax.Array]) -> list[jax.Array]:
        return cross_packed(
            lambda _, buffers: host_group(_BROADCAST, buffers, in_place=True, name=name, process_set=process_set,
                                          root_rank=root_rank),
            xs,
        )  # fmt: skip

    def backward(xs: list[jax.Array], cotangents: list[jax.Array]) -> list[jax.Array]:
        averaged = _allreduce_group(cotangents, None, Average, 1.0, 1.0, process_set, caller)
        return averaged if current_job().rank == root_rank else [jnp.zeros_like(g) for g in averaged]

    return _differentiable(forward, backward, arrays)


def broadcast(
    tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> jax.Array:
    """Returns ``root_rank``'s ``tensor`` on every rank (``root_rank`` is a rank of the job); differentiable."""
    process_set = _checked_set(process_set, "broadcast")
    root = check_root(root_rank, current_job().size, "jax.broadcast")
    return broadcast_group([check_array(tensor, "broadcast")], root, name, process_set, "broadcast")[0]


# --- alltoall --------------------------------------------------------------------------------


def _alltoall(array: jax.Array, send: list[int], name: str | None, process_set: ProcessSet) -> jax.Array:
    """The differentiable alltoall of ``array``, sending ``send[i]`` rows to member ``i`` (static counts)."""
    # Every member's counts, exchanged on the host now (JAX needs the output's shape when it traces).
    every = host_group(_ALLGATHER, [np.asarray(send, dtype=np.int64)], in_place=False, name="jax.shapes.alltoall",
                       process_set=process_set)[0].reshape(len(send), len(send))  # fmt: skip
    received = every[:, process_set.rank()].tolist()

    def forward(xs: list[jax.Array]) -> list[jax.Array]:
        def host(buffer: np.ndarray) -> list[np.ndarray]:
            output, _ = _forms.call(_ALLTOALL, buffer, adapter=_NUMPY, grouped=False, in_place=False, wait=True,
                                    name=name, process_set=process_set, splits=send)  # fmt: skip
            return [output]

        x = xs[0]
        return cross(host, [x], [jax.ShapeDtypeStruct((sum(received), *x.shape[1:]), x.dtype)])

    def backward(xs: list[jax.Array], cotangents: list[jax.Array]) -> list[jax.Array]:
        return [_alltoall(cotangents[0], received, None, process_set)[0]]  # rows go back where they came from

    return _differentiable(forward, backward, [array])[0], received


def alltoall(
    tensor: Any, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Scatters slices of ``tensor`` to the members and gathers the slices sent here; differentiable.

    Slice ``i`` (along the first dimension, ``splits[i]`` rows; even slices
    without ``splits``) goes to member ``i`` of ``process_set``. ``splits``
    must be concrete (a list or numpy array, not a traced value): JAX needs
    the output's shape when it traces. Returns the received slices
    concatenated in member order; when ``splits`` is given,
    ``(output, received_splits)`` (int32), as in Horovod.
    """
    process_set = _checked_set(process_set, "alltoall")
    array = check_array(tensor, "alltoall", 1)
    if isinstance(splits, jax.core.Tracer):
        raise TypeError("hora.jax.alltoall needs concrete splits (a list or numpy array), got a traced value.")
    send = alltoall_rows(array.shape[0], None if splits is None else np.asarray(splits), process_set.size())
    output, received = _alltoall(array, send, name, process_set)
    return output if splits is None else (output, jnp.asarray(received, dtype=jnp.int32))


# --- reducescatter ---------------------------------------------------------------------------


def _reducescatter_group(arrays: list[jax.Array], name: str | None, op: Any, pre: float, post: float,
                         process_set: ProcessSet, caller: str) -> list[jax.Array]:  # fmt: skip
    members, member = process_set.size(), process_set.rank()

    def forward(xs: list[jax.Array]) -> list[jax.Array]:
        # This member's rows: the first shape[0] % members members get one more.
        shares = [x.shape[0] // members + (1 if member < x.shape[0] % members else 0) for x in xs]
        outputs = [jax.ShapeDtypeStruct((s, *x.shape[1:]), x.dtype) for x, s in zip(xs, shares, strict=True)]
        return cross(
            lambda *buffers: host_group(_REDUCESCATTER, list(buffers), in_place=False, name=name, op=op,
                                        prescale_factor=pre, postscale_factor=post, process_set=process_set),
            xs, outputs,
        )  # fmt: skip

    def backward(xs: list[jax.Array], cotangents: list[jax.Array]) -> list[jax.Array]:
        _forms.check_differentiable(op, f"jax.{caller}")
        scale = _forms.reducescatter_gradient_scale(op, pre, post, members)
        return _allgather_group([g * scale if scale != 1 else g for g in cotangents], None, process_set, caller)

    return _differentiable(forward, backward, arrays)


def reducescatter(
    tensor: Any,
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> jax.Array:
    """Returns this rank's rows of the reduction of ``tensor``; differentiable.

    The first dimension is split as evenly as possible over the members; the
    first ``shape[0] % members`` get one extra row.
    """
    op = _forms.horovod_op(op, None, "jax.reducescatter")
    process_set = _checked_set(process_set, "reducescatter")
    array = check_array(tensor, "reducescatter", 1)
    return _reducescatter_group([array], name, op, float(prescale_factor), float(postscale_factor), process_set,
                                "reducescatter")[0]  # fmt: skip


def grouped_reducescatter(
    tensors: Sequence[Any],
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[jax.Array]:
    """Returns this rank's rows of the reductions of ``tensors``, computed as one unit; differentiable."""
    op = _forms.horovod_op(op, None, "jax.grouped_reducescatter")
    process_set = _checked_set(process_set, "grouped_reducescatter")
    arrays = check_arrays(tensors, "grouped_reducescatter", 1)
    if not arrays:
        return []
    return _reducescatter_group(arrays, name, op, float(prescale_factor), float(postscale_factor), process_set,
                                "grouped_reducescatter")  # fmt: skip
