"""numpy arrays as engine requests: the checks and conversions every collective of :mod:`hora.ops` makes.

Private: ``hora.ops`` and the framework adapters use these; users call the collectives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hora import _native
from hora.handles import Request, Result

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


def _as_array(tensor: object, caller: str, min_dims: int = 0) -> np.ndarray:
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
    if array.dtype not in _DTYPES:
        _data_type(array, caller)  # bfloat16, or raises
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
    kind: _native.RequestKind,
    name: str,
    process_set: int,
    op: _native.ReduceOp = _native.ReduceOp.SUM,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = -1,
    splits: Sequence[int] = (),
) -> Request:
    """The engine request for ``array`` (the engine reads its dtype and shape from the buffer)."""
    if array.dtype in _DTYPES:
        return Request(kind, name, array, None, op, prescale, postscale, root, process_set, splits)
    # bfloat16 has no buffer format: the engine gets its bits and is told the type
    dtype = _data_type(array, caller)
    return Request(kind, name, _raw(array), dtype, op, prescale, postscale, root, process_set, splits)


def _output(result: Result, like: np.ndarray) -> np.ndarray:
    """An engine-allocated result as an array of ``like``'s dtype (no copy)."""
    return result.output.view(like.dtype).reshape(result.shape)


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
