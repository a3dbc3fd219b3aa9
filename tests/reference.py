"""Reference results for the collectives, computed in numpy (float64 where it matters)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPES = [
    np.dtype(np.uint8),
    np.dtype(np.int8),
    np.dtype(np.int16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.bool_),
]
OPS = ["SUM", "AVERAGE", "MIN", "MAX", "PRODUCT"]


def make_input(dtype: np.dtype, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Small values, so that sums and products stay exact in every dtype."""
    rng = np.random.default_rng(seed * 1000 + rank)
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    low = 0 if dtype == np.uint8 else -2
    return rng.integers(low, 3, count).astype(dtype)


def reduce_reference(inputs: list[np.ndarray], op: str, prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
    dtype = inputs[0].dtype
    if dtype == np.bool_:
        stack = np.stack(inputs)
        result = stack.any(axis=0) if op in ("SUM", "MAX") else stack.all(axis=0)
        return result
    stack = np.stack([x.astype(np.float64) for x in inputs])
    if np.issubdtype(dtype, np.integer):
        stack = np.trunc(stack * prescale) if prescale != 1.0 else stack
    else:
        stack = stack * prescale
    if op in ("SUM", "AVERAGE"):
        result = stack.sum(axis=0)
    elif op == "MIN":
        result = stack.min(axis=0)
    elif op == "MAX":
        result = stack.max(axis=0)
    else:
        result = stack.prod(axis=0)
    if op == "AVERAGE":
        result = np.trunc(result / len(inputs)) if np.issubdtype(dtype, np.integer) else result / len(inputs)
    result = result * postscale
    if np.issubdtype(dtype, np.integer):
        result = np.trunc(result)
    return result


def tolerance(dtype: np.dtype) -> float:
    if dtype == np.float16:
        return 1e-2
    if dtype.name == "bfloat16":
        return 5e-2
    return 1e-6


def alltoall_reference(inputs: list[np.ndarray], splits: list[list[int]], rank: int) -> np.ndarray:
    """What ``rank`` receives when rank p sends ``splits[p][q]`` rows of ``inputs[p]`` to each rank q."""
    pieces = []
    for p, rows in enumerate(splits):
        start = sum(rows[:rank])
        pieces.append(inputs[p][start : start + rows[rank]])
    return np.concatenate(pieces).astype(np.float64)


def reducescatter_slice(rows: int, size: int, rank: int) -> slice:
    """The rows of a reducescatter's result that ``rank`` gets: even shares, the first ones one longer."""
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])
