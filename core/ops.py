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

from collections.abc import Sequence

import numpy as np
from hora import _forms, _native
from hora._arrays import (
    _DTYPES,
    _as_array,
    _output,
    _request,
    _tensors,
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

# --- numpy arrays as the request layer sees them (hora._forms) ------------------------------------


class _Staged:
    """The arrays of one call: what the engine reads and writes, and what the call returns."""

    __slots__ = ("hosts",)

    def __init__(self, hosts: list[np.ndarray]) -> None:
        self.hosts = hosts

    def written(self) -> list[np.ndarray]:
        return self.hosts  # the inputs (in place) or the copies the engine wrote into


class _Numpy:
    """The request layer's adapter for numpy arrays (and anything ``numpy.asarray`` takes)."""

    def check(self, tensor: object, caller: str, min_dims: int) -> np.ndarray:
        return _as_array(tensor, caller, min_dims)

    def sequence(self, tensors: object, caller: str) -> list[object]:
        return _tensors(tensors, caller)

    def stage(self, arrays: list[np.ndarray], caller: str, *, in_place: bool, writes: bool) -> _Staged:
        if in_place:
            for array in arrays:
                if not array.flags.writeable:
                    raise ValueError(f"hora.{caller} works in place and needs a writable array.")
            return _Staged(arrays)
        if writes:  # the copy forms of allreduce and broadcast leave their inputs unchanged
            return _Staged([np.array(a, copy=True) for a in arrays])
        return _Staged(arrays)

    request = staticmethod(_request)
    output = staticmethod(_output)

    def alltoall_output(self, output: np.ndarray, result: Result, splits_given: bool) -> object:
        return (output, np.asarray(result.received_splits, dtype=np.int64)) if splits_given else output

    def splits(self, splits: object) -> object:
        return splits


_NUMPY = _Numpy()


_ALLREDUCE, _ALLGATHER, _BROADCAST = _forms.ALLREDUCE, _forms.ALLGATHER, _forms.BROADCAST
_ALLTOALL, _REDUCESCATTER = _forms.ALLTOALL, _forms.REDUCESCATTER


def _copies_directly(tensor: object) -> bool:
    """Whether the copy forms' copy of ``tensor`` is a buffer the engine reads as it is (see ``_forms.run_in_place``).

    Checked before copying, so that a tensor the checked path must take (it
    says why, or stages bfloat16 as its bits) is not copied twice.
    """
    return isinstance(tensor, np.ndarray) and tensor.flags.c_contiguous and tensor.dtype in _DTYPES


def host_group(spec: _forms.Spec, arrays: list[np.ndarray], *, in_place: bool, **form: object) -> object:
    """The collective ``spec`` on host arrays as one group, waited for: what a framework's crossing runs.

    Private to the framework adapters that reach the engine through a host
    callback (``hora.tensorflow``, ``hora.jax``). An allreduce may pass
    ``outputs=`` for its results, and ``arrays`` are then only read (see
    :func:`hora._forms.call`).
    """
    return _forms.call(spec, arrays, adapter=_NUMPY, grouped=True, in_place=in_place, wait=True, **form)


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
    if isinstance(tensor, np.ndarray):
        handle = _forms.run_in_place(
            _ALLREDUCE, tensor, name, process_set, op, prescale_factor, postscale_factor, wait=False
        )
        if handle:
            return handle
    return _forms.call(_ALLREDUCE, tensor, adapter=_NUMPY, grouped=False, in_place=True, wait=False, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def allreduce_async(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`allreduce_async_` on a copy: the input is unchanged and the handle returns the result."""
    return _forms.call(_ALLREDUCE, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=False, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def allreduce_(
    tensor: np.ndarray,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduces ``tensor`` in place across ranks and returns it. See :func:`allreduce_async_`."""
    if isinstance(tensor, np.ndarray) and _forms.run_in_place(
        _ALLREDUCE, tensor, name, process_set, op, prescale_factor, postscale_factor
    ):
        return tensor
    return _forms.call(_ALLREDUCE, tensor, adapter=_NUMPY, grouped=False, in_place=True, wait=True, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def allreduce(
    tensor: object,
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Returns the reduction of ``tensor`` across ranks; the input is unchanged. See :func:`allreduce_async_`."""
    if _copies_directly(tensor):
        result = np.array(tensor, copy=True)
        if _forms.run_in_place(_ALLREDUCE, result, name, process_set, op, prescale_factor, postscale_factor):
            return result
    return _forms.call(_ALLREDUCE, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=True, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


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
    return _forms.call(_ALLREDUCE, tensors, adapter=_NUMPY, grouped=True, in_place=True, wait=False, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce_async(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`grouped_allreduce_async_` on copies; the inputs are unchanged."""
    return _forms.call(_ALLREDUCE, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=False, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce_(
    tensors: Sequence[np.ndarray],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Reduces every array of ``tensors`` in place as one unit and returns them."""
    return _forms.call(_ALLREDUCE, tensors, adapter=_NUMPY, grouped=True, in_place=True, wait=True, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


def grouped_allreduce(
    tensors: Sequence[object],
    name: str | None = None,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[np.ndarray]:
    """Returns the reductions of ``tensors`` across ranks, computed as one unit."""
    return _forms.call(_ALLREDUCE, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=True, name=name,
                      process_set=process_set, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)  # fmt: skip


# --- allgather -------------------------------------------------------------------------------


def allgather_async(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others, and the dtype,
    must match. ``synchronize`` returns the concatenation.
    """
    return _forms.call(_ALLGATHER, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=False, name=name,
                      process_set=process_set)  # fmt: skip


def allgather(tensor: object, name: str | None = None, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Returns every rank's ``tensor`` concatenated along the first dimension. See :func:`allgather_async`."""
    return _forms.call(_ALLGATHER, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=True, name=name,
                      process_set=process_set)  # fmt: skip


def grouped_allgather_async(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts an allgather of every array of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _forms.call(_ALLGATHER, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=False, name=name,
                      process_set=process_set)  # fmt: skip


def grouped_allgather(
    tensors: Sequence[object], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[np.ndarray]:
    """Returns the allgather of every array of ``tensors``, computed as one unit."""
    return _forms.call(_ALLGATHER, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=True, name=name,
                      process_set=process_set)  # fmt: skip


# --- broadcast -------------------------------------------------------------------------------


def broadcast_async_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts overwriting ``tensor`` on every rank with its value on ``root_rank`` (a global rank).

    Every rank passes an array of the same shape and dtype; ``synchronize``
    returns ``tensor``.
    """
    if isinstance(tensor, np.ndarray):
        handle = _forms.run_in_place(_BROADCAST, tensor, name, process_set, root_rank=root_rank, wait=False)
        if handle:
            return handle
    return _forms.call(_BROADCAST, tensor, adapter=_NUMPY, grouped=False, in_place=True, wait=False, name=name,
                      process_set=process_set, root_rank=root_rank)  # fmt: skip


def broadcast_async(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Like :func:`broadcast_async_` on a copy; the input is unchanged."""
    return _forms.call(_BROADCAST, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=False, name=name,
                      process_set=process_set, root_rank=root_rank)  # fmt: skip


def broadcast_(
    tensor: np.ndarray, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Overwrites ``tensor`` with ``root_rank``'s and returns it. See :func:`broadcast_async_`."""
    if isinstance(tensor, np.ndarray) and _forms.run_in_place(
        _BROADCAST, tensor, name, process_set, root_rank=root_rank
    ):
        return tensor
    return _forms.call(_BROADCAST, tensor, adapter=_NUMPY, grouped=False, in_place=True, wait=True, name=name,
                      process_set=process_set, root_rank=root_rank)  # fmt: skip


def broadcast(
    tensor: object, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is unchanged."""
    if _copies_directly(tensor):
        result = np.array(tensor, copy=True)
        if _forms.run_in_place(_BROADCAST, result, name, process_set, root_rank=root_rank):
            return result
    return _forms.call(_BROADCAST, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=True, name=name,
                      process_set=process_set, root_rank=root_rank)  # fmt: skip


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
    return _forms.call(_ALLTOALL, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=False, name=name,
                      process_set=process_set, splits=splits)  # fmt: skip


def alltoall(
    tensor: object,
    splits: Sequence[int] | np.ndarray | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> object:
    """Scatters slices of ``tensor`` and gathers the slices sent to this rank. See :func:`alltoall_async`."""
    return _forms.call(_ALLTOALL, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=True, name=name,
                      process_set=process_set, splits=splits)  # fmt: skip


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
    return _forms.call(_REDUCESCATTER, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=False, name=name,
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
    return _forms.call(_REDUCESCATTER, tensor, adapter=_NUMPY, grouped=False, in_place=False, wait=True, name=name,
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
    return _forms.call(_REDUCESCATTER, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=False, name=name,
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
    return _forms.call(_REDUCESCATTER, tensors, adapter=_NUMPY, grouped=True, in_place=False, wait=True, name=name,
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
