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

# --- the request layer: one spec per collective, one path for every form -----------------------


class _Spec:
    """What the request layer needs to know about one collective."""

    __slots__ = ("callers", "has_root", "has_splits", "kind", "min_dims", "name", "reduces", "writes_input")

    def __init__(self, kind: _native.RequestKind, name: str, *, writes_input: bool, reduces: bool = False,
                 min_dims: int = 0, has_root: bool = False, has_splits: bool = False) -> None:  # fmt: skip
        self.kind = kind
        self.name = name  # the public name: "allreduce"
        self.writes_input = writes_input  # the result lands in the input, else in an array the engine allocates
        self.reduces = reduces  # takes op and scale factors
        self.min_dims = min_dims
        self.has_root = has_root  # broadcast
        self.has_splits = has_splits  # alltoall
        # (grouped, in place) -> the form's name, as messages quote it: "grouped_allreduce_"
        self.callers = {
            (grouped, in_place): f"{'grouped_' if grouped else ''}{name}{'_' if in_place else ''}"
            for grouped in (False, True)
            for in_place in (False, True)
        }


_ALLREDUCE = _Spec(_Kind.ALLREDUCE, "allreduce", writes_input=True, reduces=True)
_ALLGATHER = _Spec(_Kind.ALLGATHER, "allgather", writes_input=False, min_dims=1)
_BROADCAST = _Spec(_Kind.BROADCAST, "broadcast", writes_input=True, has_root=True)
_ALLTOALL = _Spec(_Kind.ALLTOALL, "alltoall", writes_input=False, min_dims=1, has_splits=True)
_REDUCESCATTER = _Spec(_Kind.REDUCESCATTER, "reducescatter", writes_input=False, reduces=True, min_dims=1)


def _call(
    spec: _Spec,
    given: object,
    *,
    grouped: bool,
    in_place: bool,
    wait: bool,
    name: str | None,
    process_set: ProcessSet,
    op: object = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    root_rank: object = None,
    splits: object = None,
) -> Any:
    """Every form of every collective: one tensor or a group, in place or on copies, waiting or not.

    Checks the arrays, names the requests, submits them as one call (a
    group when ``grouped``) and returns the handle, or with ``wait`` the
    result: the input arrays for in-place forms, fresh arrays otherwise
    (``(output, received_splits)`` for an alltoall given ``splits``).
    """
    caller = spec.callers[grouped, in_place]
    if grouped:
        arrays = [_as_array(t, caller, writable=in_place, min_dims=spec.min_dims) for t in _tensors(given, caller)]
    else:
        arrays = [_as_array(given, caller, writable=in_place, min_dims=spec.min_dims)]
    if spec.writes_input and not in_place:
        arrays = [np.array(a, copy=True) for a in arrays]  # the copy forms leave their inputs unchanged
    job = current_job()
    ps = set_id(process_set, spec.name)
    reduction = (
        _reduction(op, prescale_factor, postscale_factor, caller.rstrip("_")) if spec.reduces else (Sum, 1.0, 1.0)
    )
    root = check_root(root_rank, job.size, spec.name) if spec.has_root else -1
    send_rows: list[int] = []
    if spec.has_splits:
        send_rows = alltoall_rows(arrays[0].shape[0], splits, len(job.engine.process_set(ps)))
    group, names = request_names(job, spec.kind, name, ps, len(arrays), wait)
    kind = spec.kind
    requests = [
        _request(a, caller, kind, n, ps, *reduction, root, send_rows) for a, n in zip(arrays, names, strict=True)
    ]
    if spec.writes_input:
        kept = arrays if grouped else arrays[0]
        finish: Callable[[list[Result]], Any] = lambda results: kept  # noqa: E731
    elif spec.has_splits and splits is not None:
        finish = lambda results: (  # noqa: E731
            _output(results[0], arrays[0]),
            np.asarray(results[0].received_splits, dtype=np.int64),
        )
    else:
        finish = _outputs(arrays, single=not grouped)
    return submit(job, requests, finish, group=group, wait=wait)


# --- allreduce -------------------------------------------------------------------------------


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
    return _call(_ALLREDUCE, tensor, grouped=False, in_place=True, wait=False, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def allreduce_async(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`allreduce_async_` on a copy: the input is unchanged and the handle returns the result."""
    return _call(_ALLREDUCE, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def allreduce_(
    tensor: np.ndarray,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces ``tensor`` in place across ranks and returns it. See :func:`allreduce_async_`."""
    return _call(_ALLREDUCE, tensor, grouped=False, in_place=True, wait=True, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def allreduce(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Returns the reduction of ``tensor`` across ranks; the input is unchanged. See :func:`allreduce_async_`."""
    return _call(_ALLREDUCE, tensor, grouped=False, in_place=False, wait=True, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


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
    return _call(_ALLREDUCE, tensors, grouped=True, in_place=True, wait=False, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce_async(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`grouped_allreduce_async_` on copies; the inputs are unchanged."""
    return _call(_ALLREDUCE, tensors, grouped=True, in_place=False, wait=False, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Reduces every array of ``tensors`` in place as one unit and returns them."""
    return _call(_ALLREDUCE, tensors, grouped=True, in_place=True, wait=True, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Returns the reductions of ``tensors`` across ranks, computed as one unit."""
    return _call(_ALLREDUCE, tensors, grouped=True, in_place=False, wait=True, name=name, process_set=process_set,
                 op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)  # fmt: skip


# --- allgather -------------------------------------------------------------------------------


def _outputs(arrays: list[np.ndarray], single: bool) -> Callable[[list[Result]], Any]:
    """Turns the engine's results into arrays like the inputs: one array when ``single``, else the list."""

    def finish(results: list[Result]) -> Any:
        outputs = [_output(r, a) for r, a in zip(results, arrays, strict=True)]
        return outputs[0] if single else outputs

    return finish


def allgather_async(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others, and the dtype,
    must match. ``synchronize`` returns the concatenation.
    """
    return _call(_ALLGATHER, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set)


def allgather(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Returns every rank's ``tensor`` concatenated along the first dimension. See :func:`allgather_async`."""
    return _call(_ALLGATHER, tensor, grouped=False, in_place=False, wait=True, name=name, process_set=process_set)


def grouped_allgather_async(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts an allgather of every array of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _call(_ALLGATHER, tensors, grouped=True, in_place=False, wait=False, name=name, process_set=process_set)


def grouped_allgather(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[np.ndarray]:
    """Returns the allgather of every array of ``tensors``, computed as one unit."""
    return _call(_ALLGATHER, tensors, grouped=True, in_place=False, wait=True, name=name, process_set=process_set)


# --- broadcast -------------------------------------------------------------------------------


def broadcast_async_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts overwriting ``tensor`` on every rank with its value on ``root_rank`` (a global rank).

    Every rank passes an array of the same shape and dtype; ``synchronize``
    returns ``tensor``.
    """
    return _call(_BROADCAST, tensor, grouped=False, in_place=True, wait=False, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


def broadcast_async(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Like :func:`broadcast_async_` on a copy; the input is unchanged."""
    return _call(_BROADCAST, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


def broadcast_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Overwrites ``tensor`` with ``root_rank``'s and returns it. See :func:`broadcast_async_`."""
    return _call(_BROADCAST, tensor, grouped=False, in_place=True, wait=True, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


def broadcast(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is unchanged."""
    return _call(_BROADCAST, tensor, grouped=False, in_place=False, wait=True, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


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
    return _call(_ALLTOALL, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set,
                 splits=splits)  # fmt: skip


def alltoall(
    tensor: object,
    splits: Sequence[int] | np.ndarray | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> object:
    """Scatters slices of ``tensor`` and gathers the slices sent to this rank. See :func:`alltoall_async`."""
    return _call(_ALLTOALL, tensor, grouped=False, in_place=False, wait=True, name=name, process_set=process_set,
                 splits=splits)  # fmt: skip


# --- reducescatter ---------------------------------------------------------------------------


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
    return _call(_REDUCESCATTER, tensor, grouped=False, in_place=False, wait=False, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip


def reducescatter(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Returns this rank's slice of the reduction of ``tensor``. See :func:`reducescatter_async`."""
    return _call(_REDUCESCATTER, tensor, grouped=False, in_place=False, wait=True, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip


def grouped_reducescatter_async(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts a reducescatter of every array of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _call(_REDUCESCATTER, tensors, grouped=True, in_place=False, wait=False, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip


def grouped_reducescatter(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[np.ndarray]:
    """Returns this rank's slices of the reductions of ``tensors``, computed as one unit."""
    return _call(_REDUCESCATTER, tensors, grouped=True, in_place=False, wait=True, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip


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
