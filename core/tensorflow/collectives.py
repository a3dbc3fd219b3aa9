"""Horovod's TensorFlow collectives, with their gradients, eager and inside ``tf.function``.

Each collective is the request layer's (``hora._forms``, on numpy buffers)
reached through :mod:`hora.tensorflow.crossing`: a group of tensors crosses
to the engine once. The gradient of each is Horovod's: allreduce of the
gradient (same op and scale factors) for allreduce; this rank's slice of the
averaged gradient for allgather; the averaged gradient on the root (zeros
elsewhere) for broadcast; alltoall back with the received splits for
alltoall; and the gathered gradient, scaled as Horovod scales it, for
reducescatter. Only Sum and Average reductions have gradients. Backward
passes run the same collectives in the same order on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from hora import _forms
from hora._arrays import alltoall_rows, check_root
from hora.basics import current_job
from hora.compression import Compression, Compressor, TensorHooks, register_tensor_hooks
from hora.ops import _NUMPY, Average, Sum, host_group
from hora.process_sets import ProcessSet, global_process_set, set_id
from hora.tensorflow.crossing import check_tensor, check_tensors, cross, cross_packed, request_name

# Autograph would rewrite these functions' Python control flow when a tf.function calls them: they are
# host-side code that builds ops, so they run as written.
_not_converted = tf.autograph.experimental.do_not_convert

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

register_tensor_hooks(
    tf.Tensor,
    TensorHooks(
        is_floating=lambda t: t.dtype.is_floating,
        dtype=lambda t: t.dtype,
        cast=lambda t, dtype: tf.cast(t, tf.float16 if dtype == "float16" else dtype),
    ),
)

_ALLREDUCE, _ALLGATHER, _BROADCAST = _forms.ALLREDUCE, _forms.ALLGATHER, _forms.BROADCAST
_ALLTOALL, _REDUCESCATTER = _forms.ALLTOALL, _forms.REDUCESCATTER


def _checked_set(process_set: ProcessSet, caller: str) -> ProcessSet:
    """``process_set``, checked now (at trace time in a graph) rather than when the graph runs."""
    set_id(process_set, f"tensorflow.{caller}")
    return process_set


def _floating(tensors: Sequence[tf.Tensor]) -> bool:
    return any(t.dtype.is_floating for t in tensors)


def _grads(grads: Sequence[Any], like: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The output gradients of a collective, zeros where an output was not used."""
    return [tf.zeros_like(y) if g is None else tf.convert_to_tensor(g) for g, y in zip(grads, like, strict=True)]


def _differentiable(forward: Any, backward: Any, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """``forward(tensors)`` with ``backward(inputs, output_grads)`` as its gradient.

    ``backward`` sees the floating-point positions only (their inputs and
    output gradients, zeros where an output was unused); the others get no
    gradient. Without a floating-point tensor there is nothing to differentiate.
    """
    if not _floating(tensors):
        return forward(tensors)

    @tf.custom_gradient
    def differentiable(*xs: tf.Tensor) -> Any:
        ys = forward(list(xs))

        def gradient(*dys: Any) -> list[Any]:
            floating = [i for i, y in enumerate(ys) if y.dtype.is_floating]
            dys = _grads(dys, ys)
            grads: list[Any] = [None] * len(ys)
            for i, g in zip(floating, backward([xs[i] for i in floating], [dys[i] for i in floating]), strict=True):
                grads[i] = g
            return grads

        return ys, gradient

    return list(differentiable(*tensors))


def _first_dim_open(outputs: list[tf.Tensor], inputs: list[tf.Tensor]) -> list[tf.Tensor]:
    """``outputs`` with the static shapes of ``inputs`` but for the first dimension, which the engine decides."""
    for x, out in zip(inputs, outputs, strict=True):
        out.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))
    return outputs


# --- allreduce -------------------------------------------------------------------------------


def _allreduce_group(
    tensors: list[tf.Tensor], name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet, caller: str
) -> list[tf.Tensor]:
    """The differentiable allreduce of ``tensors`` as one unit (one crossing)."""

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        named = request_name(name)
        return cross_packed(
            lambda inputs, outputs: host_group(_ALLREDUCE, inputs, in_place=True, outputs=outputs, name=named, op=op,
                                               prescale_factor=pre, postscale_factor=post, process_set=process_set),
            xs, caller, reads_inputs=True,
        )  # fmt: skip

    def backward(xs: list[tf.Tensor], dys: list[tf.Tensor]) -> list[tf.Tensor]:
        _forms.check_differentiable(op, f"tensorflow.{caller}")
        return _allreduce_group(dys, None, op, pre, post, process_set, caller)

    return _differentiable(forward, backward, tensors)


def sparse_allreduce(
    slices: list[tf.IndexedSlices], op: Any, pre: float, post: float, process_set: ProcessSet, caller: str
) -> list[tf.IndexedSlices]:
    """Horovod's allreduce of ``tf.IndexedSlices``: values and indices allgathered, all in one crossing.

    For Average the gathered values are divided by the set size (as in
    Horovod, integer values become float64), then multiplied by the scale
    factors (which Horovod refuses here).
    """
    if op not in (Sum, Average):
        raise NotImplementedError(
            f"hora.tensorflow.{caller}: only Sum and Average are supported with tf.IndexedSlices, got {op}; "
            "pass sparse_as_dense=True to reduce them as dense tensors."
        )
    if not slices:
        return []
    parts = [p for s in slices for p in (tf.convert_to_tensor(s.values), tf.convert_to_tensor(s.indices))]
    gathered = _allgather_group(parts, None, process_set, caller)
    results = []
    for s, values, indices in zip(slices, gathered[0::2], gathered[1::2], strict=True):
        if op == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        if pre * post != 1.0:  # Horovod refuses scale factors here; the tape's predivide pair multiplies to 1
            values = values * tf.cast(pre * post, values.dtype)
        results.append(tf.IndexedSlices(values, indices, dense_shape=s.dense_shape))
    return results


@_not_converted
def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Returns the reduction of ``tensor`` across the ranks of ``process_set``; differentiable.

    Args:
        tensor: a tf.Tensor (or tf.Variable), the same shape and dtype on
            every rank; or ``tf.IndexedSlices``, which are allgathered (values
            and indices) instead, the values divided by the set size for Average.
        average: Horovod's older spelling of ``op``: True for Average, False for Sum.
        device_dense, device_sparse: accepted for Horovod compatibility; the
            engine runs on the host.
        compression: ``Compression.fp16`` sends floating-point tensors as
            float16; the result has ``tensor``'s dtype.
        op: hora.Average (default), Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        name: matched across ranks (default: an automatic name, the same on
            every rank when the ranks run the same collectives in the same order).
        process_set: the ranks that take part (default: all).
        ignore_name_scope: accepted for Horovod compatibility.
    """
    op = _forms.horovod_op(op, average, "tensorflow.allreduce")
    process_set = _checked_set(process_set, "allreduce")
    pre, post = float(prescale_factor), float(postscale_factor)
    if isinstance(tensor, tf.IndexedSlices):
        return sparse_allreduce([tensor], op, pre, post, process_set, "allreduce")[0]
    compressed, ctx = compression.compress(check_tensor(tensor, "allreduce"))
    reduced = _allreduce_group([compressed], name, op, pre, post, process_set, "allreduce")[0]
    return compression.decompress(reduced, ctx)


@_not_converted
def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    name: str | None = None,
) -> list[Any]:
    """Returns the reductions of ``tensors``, computed as one unit (one crossing, one buffer per dtype).

    ``tf.IndexedSlices`` in the list are allgathered as in :func:`allreduce`.
    Other arguments as in :func:`allreduce`.
    """
    op = _forms.horovod_op(op, average, "tensorflow.grouped_allreduce")
    process_set = _checked_set(process_set, "grouped_allreduce")
    pre, post = float(prescale_factor), float(postscale_factor)
    if isinstance(tensors, (tf.Tensor, tf.Variable, np.ndarray)) or not isinstance(tensors, Sequence):
        raise TypeError(f"hora.tensorflow.grouped_allreduce expects a list of tensors, got {type(tensors).__name__}.")
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    results: list[Any] = [None] * len(tensors)
    gathered = sparse_allreduce([tensors[i] for i in sparse], op, pre, post, process_set, "grouped_allreduce")
    for i, g in zip(sparse, gathered, strict=True):
        results[i] = g
    if dense:
        packed = [compression.compress(check_tensor(tensors[i], "grouped_allreduce")) for i in dense]
        reduced = _allreduce_group([c for c, _ in packed], name, op, pre, post, process_set, "grouped_allreduce")
        for i, r, (_, ctx) in zip(dense, reduced, packed, strict=True):
            results[i] = compression.decompress(r, ctx)
    return results


# --- allgather -------------------------------------------------------------------------------


def _allgather_group(
    tensors: list[tf.Tensor], name: str | None, process_set: ProcessSet, caller: str
) -> list[tf.Tensor]:
    """The differentiable allgather of ``tensors`` as one unit (one crossing)."""

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        named = request_name(name)
        outputs = cross(
            lambda *arrays: host_group(_ALLGATHER, list(arrays), in_place=False, name=named, process_set=process_set),
            xs, [x.dtype for x in xs], caller,
        )  # fmt: skip
        return _first_dim_open(outputs, xs)

    def backward(xs: list[tf.Tensor], dys: list[tf.Tensor]) -> list[tf.Tensor]:
        # This rank's rows of the averaged gradient, as in Horovod.
        averaged = _allreduce_group(dys, None, Average, 1.0, 1.0, process_set, caller)
        rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
        every_rows = tf.reshape(_allgather_group([rows], None, process_set, caller)[0], [-1, len(xs)])
        member = process_set.rank()
        starts = tf.reduce_sum(every_rows[:member], axis=0)
        return [g[starts[k] : starts[k] + every_rows[member, k]] for k, g in enumerate(averaged)]

    return _differentiable(forward, backward, tensors)


@_not_converted
def allgather(
    tensor: Any, name: str | None = None, ignore_name_scope: bool = False, process_set: ProcessSet = global_process_set
) -> tf.Tensor:
    """Returns every rank's ``tensor`` concatenated along the first dimension, in rank order; differentiable.

    The first dimension may differ between ranks; the others, and the dtype, must match.
    """
    process_set = _checked_set(process_set, "allgather")
    return _allgather_group([check_tensor(tensor, "allgather", 1)], name, process_set, "allgather")[0]


@_not_converted
def grouped_allgather(
    tensors: Sequence[Any],
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Returns the allgather of every tensor of ``tensors``, computed as one unit; differentiable."""
    process_set = _checked_set(process_set, "grouped_allgather")
    checked = check_tensors(tensors, "grouped_allgather", 1)
    return _allgather_group(checked, name, process_set, "grouped_allgather")


# --- broadcast -------------------------------------------------------------------------------


def broadcast_group(
    tensors: list[tf.Tensor], root_rank: int, name: str | None, process_set: ProcessSet, caller: str
) -> list[tf.Tensor]:
    """``root_rank``'s values of ``tensors`` on every rank, as one unit (one crossing); differentiable."""

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        named = request_name(name)
        return cross_packed(
            lambda _, buffers: host_group(_BROADCAST, buffers, in_place=True, name=named, process_set=process_set,
                                        root_rank=root_rank),
            xs, caller,
        )  # fmt: skip

    def backward(xs: list[tf.Tensor], dys: list[tf.Tensor]) -> list[tf.Tensor]:
        # The averaged gradient on the root (as in Horovod); other ranks get zeros.
        averaged = _allreduce_group(dys, None, Average, 1.0, 1.0, process_set, caller)
        return averaged if current_job().rank == root_rank else [tf.zeros_like(g) for g in averaged]

    return _differentiable(forward, backward, tensors)


@_not_converted
def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank (``root_rank`` is a rank of the job); differentiable."""
    process_set = _checked_set(process_set, "broadcast")
    root = check_root(root_rank, current_job().size, "tensorflow.broadcast")
    return broadcast_group([check_tensor(tensor, "broadcast")], root, name, process_set, "broadcast")[0]


# --- alltoall --------------------------------------------------------------------------------


def _alltoall(tensor: tf.Tensor, splits: tf.Tensor | None, name: str | None, process_set: ProcessSet) -> Any:
    named = request_name(name)

    def host(array: np.ndarray, *given: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Even slices are passed as explicit splits too, so the engine reports what each member really sent
        # (ranks may hold different numbers of rows).
        send = given[0] if given else alltoall_rows(array.shape[0], None, process_set.size())
        output, received = _forms.call(_ALLTOALL, array, adapter=_NUMPY, grouped=False, in_place=False, wait=True,
                                       name=named, process_set=process_set, splits=send)  # fmt: skip
        return output, np.asarray(received, dtype=np.int32)

    inputs = [tensor] if splits is None else [tensor, splits]
    output, received = cross(host, inputs, [tensor.dtype, tf.int32], "alltoall")
    output.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    received.set_shape([process_set.size()])
    return output, received


@_not_converted
def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Scatters slices of ``tensor`` to the members and gathers the slices sent here; differentiable.

    Slice ``i`` (along the first dimension, ``splits[i]`` rows; even slices
    without ``splits``) goes to member ``i`` of ``process_set``. Returns the
    received slices concatenated in member order; when ``splits`` is given,
    ``(output, received_splits)`` with how many rows came from each member
    (int32), as in Horovod.
    """
    process_set = _checked_set(process_set, "alltoall")
    t = check_tensor(tensor, "alltoall", 1)
    s = None if splits is None else tf.cast(tf.reshape(tf.convert_to_tensor(splits), [-1]), tf.int64)

    if not t.dtype.is_floating:
        output, received = _alltoall(t, s, name, process_set)
        return output if splits is None else (output, received)

    @tf.custom_gradient
    def differentiable(x: tf.Tensor) -> Any:
        output, received = _alltoall(x, s, name, process_set)

        def backward(d_output: Any, _d_received: Any) -> Any:
            back, _ = _alltoall(_grads([d_output], [output])[0], tf.cast(received, tf.int64), None, process_set)
            return back

        return (output, received), backward

    output, received = differentiable(t)
    return output if splits is None else (output, tf.stop_gradient(received))


# --- reducescatter ---------------------------------------------------------------------------


def _reducescatter_group(
    tensors: list[tf.Tensor], name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet, caller: str
) -> list[tf.Tensor]:
    """The differentiable reducescatter of ``tensors`` as one unit (one crossing)."""

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        named = request_name(name)
        outputs = cross(
            lambda *arrays: host_group(_REDUCESCATTER, list(arrays), in_place=False, name=named, op=op,
                                     prescale_factor=pre, postscale_factor=post, process_set=process_set),
            xs, [x.dtype for x in xs], caller,
        )  # fmt: skip
        return _first_dim_open(outputs, xs)

    def backward(xs: list[tf.Tensor], dys: list[tf.Tensor]) -> list[tf.Tensor]:
        _forms.check_differentiable(op, f"tensorflow.{caller}")
        scale = _forms.reducescatter_gradient_scale(op, pre, post, process_set.size())
        scaled = [g * tf.cast(scale, g.dtype) if scale != 1 else g for g in dys]
        return _allgather_group(scaled, None, process_set, caller)

    return _differentiable(forward, backward, tensors)


@_not_converted
def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Compressor = Compression.none,
    op: Any = Average,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Returns this rank's slice of the reduction of ``tensor``; differentiable.

    The first dimension is split as evenly as possible over the members; the
    first ``shape[0] % members`` get one extra row. Other arguments as in
    :func:`allreduce`.
    """
    op = _forms.horovod_op(op, None, "tensorflow.reducescatter")
    process_set = _checked_set(process_set, "reducescatter")
    compressed, ctx = compression.compress(check_tensor(tensor, "reducescatter", 1))
    result = _reducescatter_group(
        [compressed], name, op, float(prescale_factor), float(postscale_factor), process_set, "reducescatter"
    )[0]
    return compression.decompress(result, ctx)


@_not_converted
def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Compressor = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> list[tf.Tensor]:
    """Returns this rank's slices of the reductions of ``tensors``, computed as one unit; differentiable."""
    op = _forms.horovod_op(op, None, "tensorflow.grouped_reducescatter")
    process_set = _checked_set(process_set, "grouped_reducescatter")
    packed = [compression.compress(t) for t in check_tensors(tensors, "grouped_reducescatter", 1)]
    results = _reducescatter_group(
        [c for c, _ in packed], name, op, float(prescale_factor), float(postscale_factor), process_set,
        "grouped_reducescatter",
    )  # fmt: skip
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, packed, strict=True)]
