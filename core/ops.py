"""Collective operations on numpy arrays.

In this release every collective is synchronous: it returns when the result
is complete, and every rank must call the same collectives in the same order.
Before moving data, ranks exchange a small description of their arguments
(operation, dtype, shape, root, reduction), so a mismatch raises the same
``ValueError`` on every rank instead of corrupting data or hanging.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
from hora import _native
from hora.basics import _Job, current_job

__all__ = [
    "Average",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allreduce",
    "allreduce_",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "reducescatter",
]

ReduceOp = _native.ReduceOp
Sum = ReduceOp.SUM
Average = ReduceOp.AVERAGE
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

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


class _Kind(enum.IntEnum):
    ALLREDUCE = 1
    ALLGATHER = 2
    BROADCAST = 3
    ALLTOALL = 4
    REDUCESCATTER = 5


def _data_type(array: np.ndarray, caller: str) -> _native.DataType:
    found = _DTYPES.get(array.dtype)
    if found is None and array.dtype.name == "bfloat16" and array.dtype.itemsize == 2:
        found = _native.DataType.BFLOAT16  # ml_dtypes.bfloat16, as used by JAX and TensorFlow
    if found is None:
        raise TypeError(f"hora.{caller} does not support dtype {array.dtype}; supported dtypes: {_SUPPORTED}.")
    return found


def _as_array(tensor: object, caller: str, *, writable: bool = False) -> np.ndarray:
    array = tensor if isinstance(tensor, np.ndarray) else np.asarray(tensor)
    if not array.flags.c_contiguous:
        raise ValueError(
            f"hora.{caller} needs a C-contiguous array, got one with shape {array.shape} and strides "
            f"{array.strides}; pass numpy.ascontiguousarray(x)."
        )
    if len(array.shape) > _MAX_DIMS:
        raise ValueError(f"hora.{caller} supports at most {_MAX_DIMS} dimensions, got {array.ndim}.")
    if writable and not array.flags.writeable:
        raise ValueError(f"hora.{caller} works in place and needs a writable array.")
    _data_type(array, caller)
    return array


def _raw(array: np.ndarray) -> np.ndarray:
    """The array as the compiled core sees it: bfloat16 has no buffer format, so pass its bits."""
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def _check_op(op: object, caller: str) -> _native.ReduceOp:
    if not isinstance(op, _native.ReduceOp):
        raise TypeError(f"hora.{caller}: op must be one of hora.Sum, Average, Min, Max, Product; got {op!r}.")
    return op


def _agree(job: _Job, kind: _Kind, array: np.ndarray, *, op: int = -1, root: int = -1) -> np.ndarray:
    """Exchanges argument descriptions; returns every rank's shape, raises on a mismatch.

    Raises ValueError on every rank alike, because every rank checks the same
    gathered table.
    """
    caller = kind.name.lower()
    mine = np.full(5 + _MAX_DIMS, -1, dtype=np.int64)
    mine[:5] = [kind, int(_data_type(array, caller)), op, root, array.ndim]
    mine[5 : 5 + array.ndim] = array.shape
    if job.size == 1:
        table = mine[np.newaxis, :]
    else:
        table = np.empty((job.size, mine.size), dtype=np.int64)
        _native.allgather(job.transport, mine, table, [mine.nbytes] * job.size)
    fields = [("operation", 0), ("dtype", 1), ("reduction", 2), ("root rank", 3), ("number of dimensions", 4)]
    for label, column in fields:
        values = table[:, column]
        if (values != values[0]).any():
            other = int(np.nonzero(values != values[0])[0][0])
            raise ValueError(
                f"hora.{caller}: ranks disagree on the {label}: rank 0 has "
                f"{_describe(label, values[0])} but rank {other} has {_describe(label, values[other])}. "
                "Every rank must call the same collectives in the same order with matching arguments."
            )
    return table[:, 5 : 5 + array.ndim]


def _describe(label: str, value: np.int64) -> str:
    if label == "operation":
        return f"hora.{_Kind(int(value)).name.lower()}"
    if label == "dtype":
        return _native.DataType(int(value)).name.lower()
    if label == "reduction":
        return _native.ReduceOp(int(value)).name.title() if value >= 0 else "none"
    return str(int(value))


def _row_bytes(array: np.ndarray) -> int:
    """Bytes in one slice along the first dimension."""
    return array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def _require_same_shapes(caller: str, shapes: np.ndarray, start_dim: int = 0) -> None:
    first = shapes[0, start_dim:]
    for other in range(1, shapes.shape[0]):
        if (shapes[other, start_dim:] != first).any():
            which = "shape" if start_dim == 0 else "shape after the first dimension"
            raise ValueError(
                f"hora.{caller}: rank 0 has shape {tuple(int(d) for d in shapes[0])} but rank {other} has "
                f"shape {tuple(int(d) for d in shapes[other])}; the {which} must be the same on every rank."
            )


def allreduce_(
    tensor: np.ndarray,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Reduces ``tensor`` across all ranks in place and returns it.

    Args:
        tensor: a writable C-contiguous array, the same shape and dtype on every rank.
        op: hora.Average (default, as in Horovod), Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
    """
    array = _as_array(tensor, "allreduce_", writable=True)
    op = _check_op(op, "allreduce")
    job = current_job()
    with job.lock:
        _require_same_shapes("allreduce", _agree(job, _Kind.ALLREDUCE, array, op=int(op)))
        _native.allreduce(
            job.transport,
            _raw(array),
            _data_type(array, "allreduce"),
            op,
            float(prescale_factor),
            float(postscale_factor),
        )
    return array


def allreduce(
    tensor: object,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Returns the reduction of ``tensor`` over all ranks; the input is unchanged.

    Synchronous: every rank must call it, in the same order relative to other
    collectives. See :func:`allreduce_` for the arguments.
    """
    return allreduce_(np.array(_as_array(tensor, "allreduce"), copy=True), op, prescale_factor, postscale_factor)


def allgather(tensor: object) -> np.ndarray:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others, and the dtype,
    must match. Synchronous, and called in the same order on every rank.
    """
    array = _as_array(tensor, "allgather")
    if array.ndim == 0:
        raise ValueError("hora.allgather needs an array with at least one dimension; got a scalar.")
    job = current_job()
    with job.lock:
        shapes = _agree(job, _Kind.ALLGATHER, array)
        _require_same_shapes("allgather", shapes, start_dim=1)
        row_bytes = _row_bytes(array)
        rows = [int(r) for r in shapes[:, 0]]
        output = np.empty((sum(rows), *array.shape[1:]), dtype=array.dtype)
        _native.allgather(job.transport, _raw(array), _raw(output), [r * row_bytes for r in rows])
    return output


def broadcast_(tensor: np.ndarray, root_rank: int) -> np.ndarray:
    """Overwrites ``tensor`` on every rank with its value on ``root_rank``, and returns it."""
    array = _as_array(tensor, "broadcast_", writable=True)
    job = current_job()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < job.size:
        raise ValueError(
            f"hora.broadcast: root_rank={root_rank!r} is not a rank of this job; expected 0 <= root_rank < {job.size}."
        )
    with job.lock:
        _require_same_shapes("broadcast", _agree(job, _Kind.BROADCAST, array, root=int(root_rank)))
        _native.broadcast(job.transport, _raw(array), int(root_rank))
    return array


def broadcast(tensor: object, root_rank: int) -> np.ndarray:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is unchanged.

    Every rank passes an array of the same shape and dtype. Synchronous, and
    called in the same order on every rank.
    """
    return broadcast_(np.array(_as_array(tensor, "broadcast"), copy=True), root_rank)


def alltoall(tensor: object, splits: Sequence[int] | np.ndarray | None = None) -> object:
    """Scatters slices of ``tensor`` to every rank and gathers the slices sent to this one.

    Slice ``i`` (along the first dimension) goes to rank ``i``. Without
    ``splits`` the first dimension is divided evenly (it must be divisible by
    the world size). Synchronous, and called in the same order on every rank.

    Returns:
        The received slices concatenated in rank order; when ``splits`` is
        given, the tuple ``(output, received_splits)`` as in Horovod.
    """
    array = _as_array(tensor, "alltoall")
    if array.ndim == 0:
        raise ValueError("hora.alltoall needs an array with at least one dimension; got a scalar.")
    job = current_job()
    rows = array.shape[0]
    if splits is None:
        if rows % job.size:
            raise ValueError(
                f"hora.alltoall: the first dimension ({rows}) is not divisible by the world size ({job.size}); "
                "pass splits= to send uneven slices."
            )
        send_rows = np.full(job.size, rows // job.size, dtype=np.int64)
    else:
        send_rows = np.asarray(splits, dtype=np.int64).reshape(-1)
        if send_rows.size != job.size or (send_rows < 0).any() or int(send_rows.sum()) != rows:
            raise ValueError(
                f"hora.alltoall: splits={np.asarray(splits).reshape(-1).tolist()} must hold {job.size} "
                f"non-negative row counts that add up to the first dimension ({rows})."
            )
    with job.lock:
        _require_same_shapes("alltoall", _agree(job, _Kind.ALLTOALL, array), start_dim=1)
        recv_rows = np.empty(job.size, dtype=np.int64)
        _native.alltoall(job.transport, send_rows, [8] * job.size, recv_rows, [8] * job.size)
        row_bytes = _row_bytes(array)
        output = np.empty((int(recv_rows.sum()), *array.shape[1:]), dtype=array.dtype)
        _native.alltoall(
            job.transport,
            _raw(array),
            [int(r) * row_bytes for r in send_rows],
            _raw(output),
            [int(r) * row_bytes for r in recv_rows],
        )
    return output if splits is None else (output, recv_rows)


def reducescatter(
    tensor: object,
    op: _native.ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> np.ndarray:
    """Reduces ``tensor`` across ranks and returns this rank's slice of the result.

    The first dimension is split as evenly as possible; the first
    ``shape[0] % size`` ranks get one extra row. Every rank passes the same
    shape and dtype. Synchronous, and called in the same order on every rank.
    """
    array = _as_array(tensor, "reducescatter")
    if array.ndim == 0:
        raise ValueError("hora.reducescatter needs an array with at least one dimension; got a scalar.")
    op = _check_op(op, "reducescatter")
    job = current_job()
    rows, extra = divmod(array.shape[0], job.size)
    row_counts = [rows + (1 if r < extra else 0) for r in range(job.size)]
    row_elements = int(np.prod(array.shape[1:], dtype=np.int64))
    work = np.array(array, copy=True)
    with job.lock:
        _require_same_shapes("reducescatter", _agree(job, _Kind.REDUCESCATTER, array, op=int(op)))
        _native.reducescatter(
            job.transport,
            _raw(work),
            [c * row_elements for c in row_counts],
            _data_type(array, "reducescatter"),
            op,
            float(prescale_factor),
            float(postscale_factor),
        )
    start = sum(row_counts[: job.rank])
    return work[start : start + row_counts[job.rank]].copy()


def barrier() -> None:
    """Returns once every rank has called barrier()."""
    job = current_job()
    with job.lock:
        _native.barrier(job.transport)
