"""Collective operations on numpy arrays, run by the background engine.

Every collective has an ``*_async`` form that returns a :class:`hora.Handle`
at once; the plain form submits and waits. Ranks may submit requests in
different orders: the engine matches them by name (automatic names are the
same on every rank when the call sequence is), checks that the ranks agree
on shape, dtype, op, root and scale factors, fuses small tensors into one
transfer, and runs the same collectives in the same order everywhere. A
mismatch fails that request with the same ``ValueError`` on every rank; the
job goes on.

Buffers are used in place: in-place operations (``allreduce_``,
``broadcast_``) write into the caller's array, and an async operation keeps
its arrays alive until it completes. Do not modify an array while its
operation is in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hora import _native
from hora.basics import current_job
from hora.handles import Handle, RawResult, Request, run, submit
from hora.process_sets import ProcessSet, global_process_set, set_id

__all__ = [
    "Average",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "reducescatter",
    "reducescatter_async",
]

ReduceOp = _native.ReduceOp
Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

_Kind = _native.RequestKind

_DTYPES = {
    np.dtype(np.uint8): _native.DataType.UINT8,
    np.dtype(np.int8): _native.DataType.INT8,
    np.dtype(np.int16): _native.DataType.INT16,
    np.dtype(np.int32): _native.DataType.INT32,
    np.dtype(np.int64): _native.DataType.INT64,
    np.dtype(np.float16): _native.DataType.FLOAT16,
    np.dtype(np.float32): _native.DataType.FLOAT32,
    np.dtype(np.float64): _native.DataType.FLOAT64,
    np.dtype(np.bool_): _native.DataType.BOOL,
}
_SUPPORTED = "uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, bool"
_MAX_DIMS = 32


def _data_type(array: np.ndarray, caller: str) -> _native.DataType:
    found = _DTYPES.get(array.dtype)
    if found is None and array.dtype.name == "bfloat16" and array.dtype.itemsize == 2:
        found = _native.DataType.BFLOAT16  # ml_dtypes.bfloat16, as used by JAX and TensorFlow
    if found is None:
        raise TypeError(f"hora.{caller} does not support dtype {array.dtype}; supported dtypes: {_SUPPORTED}.")
    return found


def _as_array(tensor: object, caller: str, *, writable: bool = False, min_dims: int = 0) -> np.ndarray:
    array = tensor if isinstance(tensor, np.ndarray) else np.asarray(tensor)
    if not array.flags.c_contiguous:
        raise ValueError(
            f"hora.{caller} needs a C-contiguous array, got one with shape {array.shape} and strides "
            f"{array.strides}; pass numpy.ascontiguousarray(x)."
        )
    if array.ndim > _MAX_DIMS:
        raise ValueError(f"hora.{caller} supports at most {_MAX_DIMS} dimensions, got {array.ndim}.")
    if array.ndim < min_dims:
        raise ValueError(f"hora.{caller} needs an array with at least one dimension; got a scalar.")
    if writable and not array.flags.writeable:
        raise ValueError(f"hora.{caller} works in place and needs a writable array.")
    _data_type(array, caller)
    return array


def _raw(array: np.ndarray) -> np.ndarray:
    """The array as the compiled core sees it: bfloat16 has no buffer format, so pass its bits."""
    return array if array.dtype in _DTYPES else array.view(np.uint16)


def _check_op(op: object, caller: str) -> _native.ReduceOp:
    if not isinstance(op, _native.ReduceOp):
        raise TypeError(f"hora.{caller}: op must be one of hora.Sum, Average, Min, Max, Product; got {op!r}.")
    return op


def _tensors(tensors: object, caller: str) -> list[object]:
    if isinstance(tensors, np.ndarray) or not isinstance(tensors, Sequence):
        raise TypeError(f"hora.{caller} expects a list of tensors, got {type(tensors).__name__}.")
    return list(tensors)


def _request(
    array: np.ndarray,
    caller: str,
    op: _native.ReduceOp = Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = -1,
    splits: Sequence[int] = (),
) -> Request:
    """The engine request for ``array``."""
    dtype = _DTYPES.get(array.dtype)
    if dtype is None:  # bfloat16 has no buffer format: the engine gets its bits
        return Request(_raw(array), _data_type(array, caller), op, prescale, postscale, root, array.shape, splits)
    return Request(array, dtype, op, prescale, postscale, root, array.shape, splits)


def _output(raw: RawResult, like: np.ndarray) -> np.ndarray:
    """An engine-allocated result as an array of ``like``'s dtype (no copy)."""
    data, shape, _, _ = raw
    return data.view(like.dtype).reshape(shape)


def _reduction(
    op: object, prescale_factor: float, postscale_factor: float, caller: str
) -> tuple[_native.ReduceOp, float, float]:
    return _check_op(op, caller), float(prescale_factor), float(postscale_factor)


def check_root(root_rank: object, size: int, caller: str) -> int:
    """``root_rank`` as an int; raises ValueError, quoting it, when it is not a rank of a job of ``size``."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < size:
        raise ValueError(
            f"hora.{caller}: root_rank={root_rank!r} is not a rank of this job; expected 0 <= root_rank < {size}."
        )
    return int(root_rank)


def alltoall_rows(rows: int, splits: object, members: int) -> list[int]:
    """The rows an alltoall sends to each member: ``splits``, checked, or ``rows`` divided evenly."""
    if splits is None:
        if rows % members:
            raise ValueError(
                f"hora.alltoall: the first dimension ({rows}) is not divisible by the number of ranks ({members}); "
                "pass splits= to send uneven slices."
            )
        return [rows // members] * members
    given = np.asarray(splits).reshape(-1)
    send_rows = [int(s) for s in given]
    if len(send_rows) != members or any(s < 0 for s in send_rows) or sum(send_rows) != rows:
        raise ValueError(
            f"hora.alltoall: splits={given.tolist()} must hold {members} "
            f"non-negative row counts that add up to the first dimension ({rows})."
        )
    return send_rows


# --- allreduce -------------------------------------------------------------------------------


def _collective(
    kind: _native.RequestKind,
    arrays: list[np.ndarray],
    finish: Callable[[list[RawResult]], Any],
    caller: str,
    name: str | None,
    process_set: ProcessSet,
    reduction: tuple[_native.ReduceOp, float, float] = (Sum, 1.0, 1.0),
    wait: bool = False,
) -> Any:
    """Submits ``arrays`` (one request, or one group) of ``kind``; returns the handle (which keeps them
    alive), or with ``wait`` the result."""
    ps = set_id(process_set, caller)
    if wait and len(arrays) == 1:  # the synchronous call of one tensor, where latency matters most
        return finish([run(current_job(), kind, _request(arrays[0], caller, *reduction), name=name, process_set=ps)])
    requests = [_request(a, caller, *reduction) for a in arrays]
    return submit(current_job(), kind, requests, finish, name=name, process_set=ps, keep=tuple(arrays), wait=wait)


def _allreduce_in_place(
    tensor: np.ndarray,
    name: str | None,
    op: object,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    wait: bool,
) -> Any:
    array = _as_array(tensor, "allreduce_", writable=True)
    reduction = _reduction(op, prescale_factor, postscale_factor, "allreduce")
    return _collective(_Kind.ALLREDUCE, [array], lambda raw: array, "allreduce", name, process_set, reduction, wait)


def allreduce_async_(
    tensor: np.ndarray,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing ``tensor`` in place across the ranks of ``process_set``; returns a handle.

    ``synchronize(handle)`` returns ``tensor`` holding the result.

    Args:
        tensor: a writable C-contiguous array, the same shape and dtype on every rank.
        name: the request's name, matched across ranks (default: an automatic name).
        op: hora.Average (default, as in Horovod), Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks that take part (default: all).
    """
    return _allreduce_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set, wait=False)


def allreduce_async(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`allreduce_async_` on a copy: the input is unchanged and the handle returns the result."""
    work = np.array(_as_array(tensor, "allreduce"), copy=True)
    return allreduce_async_(work, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(
    tensor: np.ndarray,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces ``tensor`` in place across ranks and returns it. See :func:`allreduce_async_`."""
    return _allreduce_in_place(tensor, name, op, prescale_factor, postscale_factor, process_set, wait=True)


def allreduce(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Returns the reduction of ``tensor`` across ranks; the input is unchanged. See :func:`allreduce_async_`."""
    work = np.array(_as_array(tensor, "allreduce"), copy=True)
    return _allreduce_in_place(work, name, op, prescale_factor, postscale_factor, process_set, wait=True)


def grouped_allreduce_async_(
    tensors: Sequence[np.ndarray],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing every array of ``tensors`` in place, as one unit (one fused transfer per dtype).

    The group's tensors are named ``<name>.<i>``; ``synchronize`` returns the list.
    """
    return _grouped_allreduce_in_place(tensors, name, op, prescale_factor, postscale_factor, process_set, wait=False)


def _grouped_allreduce_in_place(
    tensors: Sequence[np.ndarray],
    name: str | None,
    op: object,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    wait: bool,
) -> Any:
    arrays = [_as_array(t, "grouped_allreduce_", writable=True) for t in _tensors(tensors, "grouped_allreduce_")]
    reduction = _reduction(op, prescale_factor, postscale_factor, "grouped_allreduce")
    return _collective(
        _Kind.ALLREDUCE, arrays, lambda raw: arrays, "grouped_allreduce", name, process_set, reduction, wait
    )


def _copies(tensors: object, caller: str) -> list[np.ndarray]:
    return [np.array(_as_array(t, caller), copy=True) for t in _tensors(tensors, caller)]


def grouped_allreduce_async(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`grouped_allreduce_async_` on copies; the inputs are unchanged."""
    copies = _copies(tensors, "grouped_allreduce")
    return _grouped_allreduce_in_place(copies, name, op, prescale_factor, postscale_factor, process_set, wait=False)


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Reduces every array of ``tensors`` in place as one unit and returns them."""
    return _grouped_allreduce_in_place(tensors, name, op, prescale_factor, postscale_factor, process_set, wait=True)


def grouped_allreduce(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Returns the reductions of ``tensors`` across ranks, computed as one unit."""
    copies = _copies(tensors, "grouped_allreduce")
    return _grouped_allreduce_in_place(copies, name, op, prescale_factor, postscale_factor, process_set, wait=True)


# --- allgather -------------------------------------------------------------------------------


def _outputs(arrays: list[np.ndarray], single: bool) -> Callable[[list[RawResult]], Any]:
    """Turns raw engine results into arrays like the inputs: one array when ``single``, else the list."""

    def finish(raw: list[RawResult]) -> Any:
        outputs = [_output(r, a) for r, a in zip(raw, arrays, strict=True)]
        return outputs[0] if single else outputs

    return finish


def _allgather(
    arrays: list[np.ndarray], caller: str, name: str | None, process_set: ProcessSet, single: bool, wait: bool
) -> Any:
    return _collective(_Kind.ALLGATHER, arrays, _outputs(arrays, single), caller, name, process_set, wait=wait)


def allgather_async(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others, and the dtype,
    must match. ``synchronize`` returns the concatenation.
    """
    array = _as_array(tensor, "allgather", min_dims=1)
    return _allgather([array], "allgather", name, process_set, single=True, wait=False)


def allgather(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Returns every rank's ``tensor`` concatenated along the first dimension. See :func:`allgather_async`."""
    array = _as_array(tensor, "allgather", min_dims=1)
    return _allgather([array], "allgather", name, process_set, single=True, wait=True)


def grouped_allgather_async(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts an allgather of every array of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _allgather(_gather_inputs(tensors), "grouped_allgather", name, process_set, single=False, wait=False)


def _gather_inputs(tensors: object) -> list[np.ndarray]:
    return [_as_array(t, "grouped_allgather", min_dims=1) for t in _tensors(tensors, "grouped_allgather")]


def grouped_allgather(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[np.ndarray]:
    """Returns the allgather of every array of ``tensors``, computed as one unit."""
    return _allgather(_gather_inputs(tensors), "grouped_allgather", name, process_set, single=False, wait=True)


# --- broadcast -------------------------------------------------------------------------------


def broadcast_async_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts overwriting ``tensor`` on every rank with its value on ``root_rank`` (a global rank).

    Every rank passes an array of the same shape and dtype; ``synchronize``
    returns ``tensor``.
    """
    return _broadcast_in_place(tensor, root_rank, name, process_set, wait=False)


def _broadcast_in_place(
    tensor: np.ndarray, root_rank: int, name: str | None, process_set: ProcessSet, wait: bool
) -> Any:
    array = _as_array(tensor, "broadcast_", writable=True)
    job = current_job()
    spec = _request(array, "broadcast", root=check_root(root_rank, job.size, "broadcast"))
    ps = set_id(process_set, "broadcast")
    return submit(job, _Kind.BROADCAST, [spec], lambda raw: array, name=name, process_set=ps, keep=(array,), wait=wait)


def broadcast_async(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Like :func:`broadcast_async_` on a copy; the input is unchanged."""
    work = np.array(_as_array(tensor, "broadcast"), copy=True)
    return _broadcast_in_place(work, root_rank, name, process_set, wait=False)


def broadcast_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Overwrites ``tensor`` with ``root_rank``'s and returns it. See :func:`broadcast_async_`."""
    return _broadcast_in_place(tensor, root_rank, name, process_set, wait=True)


def broadcast(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is unchanged."""
    work = np.array(_as_array(tensor, "broadcast"), copy=True)
    return _broadcast_in_place(work, root_rank, name, process_set, wait=True)


# --- alltoall --------------------------------------------------------------------------------


def alltoall_async(
    tensor: object,
    splits: Sequence[int] | np.ndarray | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts scattering slices of ``tensor`` to the members and gathering the slices sent here.

    Slice ``i`` (along the first dimension) goes to member ``i`` of the
    process set. Without ``splits`` the first dimension is divided evenly
    (it must be divisible by the number of members). ``synchronize`` returns
    the received slices concatenated in member order; when ``splits`` is
    given, the tuple ``(output, received_splits)`` as in Horovod.
    """
    return _alltoall(tensor, splits, name, process_set, wait=False)


def _alltoall(
    tensor: object, splits: Sequence[int] | np.ndarray | None, name: str | None, process_set: ProcessSet, wait: bool
) -> Any:
    array = _as_array(tensor, "alltoall", min_dims=1)
    job = current_job()
    ps = set_id(process_set, "alltoall")
    members = len(job.engine.process_set(ps))
    send_rows = alltoall_rows(array.shape[0], splits, members)

    def finish(raw: list[RawResult]) -> object:
        output = _output(raw[0], array)
        return output if splits is None else (output, np.asarray(raw[0][2], dtype=np.int64))

    return submit(
        job,
        _Kind.ALLTOALL,
        [_request(array, "alltoall", splits=send_rows)],
        finish,
        name=name,
        process_set=ps,
        keep=(array,),
        wait=wait,
    )


def alltoall(
    tensor: object,
    splits: Sequence[int] | np.ndarray | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> object:
    """Scatters slices of ``tensor`` and gathers the slices sent to this rank. See :func:`alltoall_async`."""
    return _alltoall(tensor, splits, name, process_set, wait=True)


# --- reducescatter ---------------------------------------------------------------------------


def _reducescatter(
    arrays: list[np.ndarray],
    caller: str,
    name: str | None,
    op: object,
    process_set: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
    single: bool,
    wait: bool,
) -> Any:
    reduction = _reduction(op, prescale_factor, postscale_factor, caller)
    finish = _outputs(arrays, single)
    return _collective(_Kind.REDUCESCATTER, arrays, finish, caller, name, process_set, reduction, wait)


def reducescatter_async(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts reducing ``tensor`` across ranks; ``synchronize`` returns this rank's slice of the result.

    The first dimension is split as evenly as possible over the members; the
    first ``shape[0] % members`` get one extra row. Every rank passes the
    same shape and dtype.
    """
    array = _as_array(tensor, "reducescatter", min_dims=1)
    return _reducescatter(
        [array], "reducescatter", name, op, process_set, prescale_factor, postscale_factor, single=True, wait=False
    )


def reducescatter(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Returns this rank's slice of the reduction of ``tensor``. See :func:`reducescatter_async`."""
    array = _as_array(tensor, "reducescatter", min_dims=1)
    return _reducescatter(
        [array], "reducescatter", name, op, process_set, prescale_factor, postscale_factor, single=True, wait=True
    )


def grouped_reducescatter_async(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts a reducescatter of every array of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _reducescatter(
        _scatter_inputs(tensors), "grouped_reducescatter", name, op, process_set, prescale_factor, postscale_factor,
        single=False, wait=False,
    )  # fmt: skip


def _scatter_inputs(tensors: object) -> list[np.ndarray]:
    return [_as_array(t, "grouped_reducescatter", min_dims=1) for t in _tensors(tensors, "grouped_reducescatter")]


def grouped_reducescatter(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[np.ndarray]:
    """Returns this rank's slices of the reductions of ``tensors``, computed as one unit."""
    return _reducescatter(
        _scatter_inputs(tensors), "grouped_reducescatter", name, op, process_set, prescale_factor, postscale_factor,
        single=False, wait=True,
    )  # fmt: skip


# --- synchronisation -------------------------------------------------------------------------


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of ``process_set`` has called barrier()."""
    ps = set_id(process_set, "barrier")
    submit(current_job(), _Kind.BARRIER, [Request()], lambda raw: None, name=None, process_set=ps, wait=True)


def join() -> int:
    """Declares that this rank has no more data, and serves the others until every rank has joined.

    While it waits, this rank takes part in the other ranks' collectives
    with the identity of the op (zeros for a sum, no rows for an allgather),
    so ranks with more steps finish theirs; an Average divides by the ranks
    that contributed. Joined ranks cannot be a broadcast's root. Applies to
    the global process set.

    Returns:
        The rank that joined last.
    """
    return submit(current_job(), _Kind.JOIN, [Request()], lambda raw: raw[0][3], name="join", process_set=0, wait=True)
