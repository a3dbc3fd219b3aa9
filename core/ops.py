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
``broadcast_``) write into the caller's array, and the engine keeps the
arrays of an operation alive until it completes, whatever becomes of its
handle. Do not modify an array while its operation is in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hora import _native
from hora._arrays import (
    _as_array,
    _output,
    _reduction,
    _request,
    _tensors,
    alltoall_rows,
    check_root,
)
from hora.basics import current_job
from hora.handles import Handle, Request, Result, request_names, submit
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

# --- allreduce -------------------------------------------------------------------------------


def _collective(
    kind: _native.RequestKind,
    arrays: list[np.ndarray],
    finish: Callable[[list[Result]], Any],
    caller: str,
    name: str | None,
    process_set: ProcessSet,
    reduction: tuple[_native.ReduceOp, float, float] = (Sum, 1.0, 1.0),
    wait: bool = False,
) -> Any:
    """Submits ``arrays`` (one request, or one group) of ``kind``; returns the handle, or with ``wait`` the result."""
    job = current_job()
    ps = set_id(process_set, caller)
    group, names = request_names(job, kind, name, ps, len(arrays), wait)
    requests = [_request(a, caller, kind, n, ps, *reduction) for a, n in zip(arrays, names, strict=True)]
    return submit(job, requests, finish, group=group, wait=wait)


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
    return _collective(_Kind.ALLREDUCE, [array], lambda results: array, "allreduce", name, process_set, reduction, wait)


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
        _Kind.ALLREDUCE, arrays, lambda results: arrays, "grouped_allreduce", name, process_set, reduction, wait
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


def _outputs(arrays: list[np.ndarray], single: bool) -> Callable[[list[Result]], Any]:
    """Turns raw engine results into arrays like the inputs: one array when ``single``, else the list."""

    def finish(results: list[Result]) -> Any:
        outputs = [_output(r, a) for r, a in zip(results, arrays, strict=True)]
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
    root = check_root(root_rank, job.size, "broadcast")
    ps = set_id(process_set, "broadcast")
    _, names = request_names(job, _Kind.BROADCAST, name, ps, 1, wait)
    request = _request(array, "broadcast", _Kind.BROADCAST, names[0], ps, root=root)
    return submit(job, [request], lambda results: array, group="", wait=wait)


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

    def finish(results: list[Result]) -> object:
        output = _output(results[0], array)
        return output if splits is None else (output, np.asarray(results[0].received_splits, dtype=np.int64))

    _, names = request_names(job, _Kind.ALLTOALL, name, ps, 1, wait)
    request = _request(array, "alltoall", _Kind.ALLTOALL, names[0], ps, splits=send_rows)
    return submit(job, [request], finish, group="", wait=wait)


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
    job = current_job()
    _, names = request_names(job, _Kind.BARRIER, None, ps, 1, True)
    submit(job, [Request(_Kind.BARRIER, names[0], process_set=ps)], lambda results: None, group="", wait=True)


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
    return submit(current_job(), [Request(_Kind.JOIN, "join")], lambda results: results[0].value, group="", wait=True)
