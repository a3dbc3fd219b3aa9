"""Reducing sparse tensors, as Horovod does: an allgather of their indices and of their values.

A sparse gradient (``nn.Embedding(sparse=True)``) touches a few rows of a
large table, and different rows on each rank. Reducing it densely would send
the whole table; instead every member gathers every member's (index, value)
pairs, and the sum is the sparse tensor of all of them (duplicates add up
when it is coalesced). Average divides the values by the number of members
of the process set. Only Sum and Average have that meaning here.
"""

from __future__ import annotations

from typing import Any

import torch
from hora._arrays import _check_op
from hora.handles import Handle, synchronize
from hora.ops import Average, Sum
from hora.process_sets import ProcessSet, global_process_set
from hora.torch.collectives import allgather_async

__all__ = ["SparseHandle", "sparse_allreduce_async"]


class SparseHandle:
    """The reduction of one sparse tensor in flight; call it (as in Horovod) or ``wait()`` for the result."""

    def __init__(self, tensor: torch.Tensor, indices: Handle, values: Handle, average: bool, members: int) -> None:
        self._shape, self._device = tensor.shape, tensor.device
        self._indices, self._values = indices, values
        self._average, self._members = average, members
        self._result: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        """Blocks until both allgathers finish; returns the coalesced sparse sum (or average)."""
        if self._result is None:
            values, indices = synchronize(self._values), synchronize(self._indices)
            if self._average:
                values = values / self._members
            result = torch.sparse_coo_tensor(indices.t(), values, self._shape, check_invariants=True)
            self._result = result.coalesce().to(self._device)
        return self._result

    def __call__(self) -> torch.Tensor:
        return self.wait()


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str, op: Any = Average, process_set: ProcessSet = global_process_set
) -> SparseHandle:
    """Starts reducing the sparse ``tensor`` across the members of ``process_set``.

    Args:
        tensor: a sparse COO tensor with the same dense shape on every member.
        name: the base name, the same on every member (``<name>.indices`` and ``<name>.values`` travel).
        op: ``hora.Average`` (divides by the set's size) or ``hora.Sum``.
        process_set: the ranks that take part (default: all).

    Returns:
        A handle; ``handle()`` (Horovod's spelling) or ``handle.wait()`` returns the coalesced sparse result.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError(
            f"hora.torch.sparse_allreduce_async expects a sparse COO tensor, got {_describe(tensor)}; "
            "reduce a dense tensor with allreduce_async."
        )
    op = _check_op(op, "sparse_allreduce_async")
    if op not in (Sum, Average):
        raise ValueError(f"hora.torch.sparse_allreduce_async supports Sum and Average, got op={op}.")
    coalesced = tensor.coalesce()
    # Allgather concatenates along the first dimension, so indices travel one row per nonzero.
    indices = allgather_async(coalesced.indices().t().contiguous(), name=f"{name}.indices", process_set=process_set)
    values = allgather_async(coalesced.values().contiguous(), name=f"{name}.values", process_set=process_set)
    return SparseHandle(tensor, indices, values, op == Average, process_set.size())


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a dense tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
