"""The differentiable collectives: Horovod's plain forms, each an ``autograd.Function``.

The gradient of each collective is its adjoint, as in Horovod: allreduce
of the gradient (same op and scale factors) for allreduce; this rank's
slice of the averaged gradient for allgather (a reducescatter when every
rank gathered the same number of rows); the average reduced to the root for
broadcast (zeros elsewhere); alltoall back with the received splits for
alltoall; and allgather for reducescatter, scaled as Horovod scales it (see
``_scaled_for_reducescatter``). Only Sum and Average reductions
have gradients. Backward passes run the same collectives in the same order
on every rank, so their automatic names match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hora import _forms
from hora._arrays import _check_op
from hora.basics import current_job
from hora.compression import Compression, Compressor
from hora.handles import synchronize
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set, set_id
from hora.torch._tensors import _check, _copy, _Kind, _reduce_op, _run_in_place, _tensors, _unrecorded_cpu
from hora.torch.collectives import _call, grouped_allgather_async, grouped_reducescatter_async

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


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.reduction = (op, pre, post, process_set)
        return _call(_forms.ALLREDUCE, tensor, grouped=False, in_place=False, wait=True, name=name, op=op,
                     prescale_factor=pre, postscale_factor=post, process_set=process_set)  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, pre, post, process_set = ctx.reduction
        _differentiable(op, "allreduce")
        return _Allreduce.apply(grad.contiguous(), None, op, pre, post, process_set), None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Compressor = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Returns the reduction of ``tensor`` across ranks; differentiable (the gradient is allreduced the same way).

    ``compression`` (``hora.torch.Compression.fp16``) sends floating-point
    tensors as float16; the result has ``tensor``'s dtype. Other arguments as
    in :func:`allreduce_async`.
    """
    t = _check(tensor, "allreduce")
    op = _reduce_op(op, average, "allreduce")
    pre, post = float(prescale_factor), float(postscale_factor)
    if compression is Compression.none and _unrecorded_cpu(t):
        result = _copy(t)  # what the checked path reduces into
        if _run_in_place(_forms.ALLREDUCE, result, name, process_set, op, pre, post, bump_version=False):
            return result
    compressed, ctx = compression.compress(t)
    reduced = _Allreduce.apply(compressed, name, op, pre, post, process_set)
    return compression.decompress(reduced, ctx)


def _differentiable(op: Any, caller: str) -> None:
    _forms.check_differentiable(op, f"torch.{caller}")


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.reduction = (op, pre, post, process_set)
        tensors = _call(_forms.ALLREDUCE, list(tensors), grouped=True, in_place=False, wait=True, name=name, op=op,
                        prescale_factor=pre, postscale_factor=post, process_set=process_set)  # fmt: skip
        return tuple(tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, pre, post, process_set = ctx.reduction
        _differentiable(op, "grouped_allreduce")
        reduced = _GroupedAllreduce.apply(None, op, pre, post, process_set, *(g.contiguous() for g in grads))
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Compressor = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Returns the reductions of ``tensors``, computed as one unit; differentiable."""
    ts = _tensors(tensors, "grouped_allreduce")
    op = _reduce_op(op, average, "grouped_allreduce")
    packed = [compression.compress(t) for t in ts]
    reduced = _GroupedAllreduce.apply(
        name, op, float(prescale_factor), float(postscale_factor), process_set, *(c for c, _ in packed)
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed, strict=True)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        handle = _call(_forms.ALLGATHER, tensor, grouped=False, in_place=False, wait=False, name=name,
                       process_set=process_set)  # checks the shape first  # fmt: skip
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        # This rank's slice of the averaged gradient (as in Horovod); when every
        # rank gathered the same number of rows that is a reducescatter.
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set).tolist()
        if len(set(rows)) == 1:
            return reducescatter(grad.contiguous(), op=Average, process_set=ctx.process_set), None, None
        averaged = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        start = sum(rows[: ctx.process_set.rank()])
        return averaged.narrow(0, start, ctx.rows), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Returns every rank's ``tensor`` concatenated along the first dimension; differentiable."""
    return _Allgather.apply(_check(tensor, "allgather"), name, process_set)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[torch.Tensor]:
    """Returns the allgather of every tensor of ``tensors``, computed as one unit (differentiable per tensor)."""
    ts = _tensors(tensors, "grouped_allgather")
    if not any(t.requires_grad for t in ts):
        return synchronize(grouped_allgather_async(ts, name, process_set))
    base = name if name is not None else current_job().unnamed(_Kind.ALLGATHER, set_id(process_set, "allgather"))
    return [_Allgather.apply(t, f"{base}.{i}", process_set) for i, t in enumerate(ts)]


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _call(_forms.BROADCAST, tensor, grouped=False, in_place=False, wait=True, name=name,
                     process_set=process_set, root_rank=root_rank)  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        # The gradient reduces to the root (averaged, as in Horovod); other ranks get zeros.
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if current_job().rank != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank; differentiable."""
    t = _check(tensor, "broadcast")
    if _unrecorded_cpu(t):
        result = _copy(t)  # what the checked path broadcasts into
        if _run_in_place(_forms.BROADCAST, result, name, process_set, root_rank=root_rank, bump_version=False):
            return result
    return _Broadcast.apply(t, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None, process_set: ProcessSet
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = _call(_forms.ALLTOALL, tensor, grouped=False, in_place=False, wait=True, name=name,
                                 process_set=process_set, splits=splits)  # fmt: skip
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _received: Any) -> tuple[Any, ...]:
        back, _ = _Alltoall.apply(grad.contiguous(), ctx.received, None, ctx.process_set)
        return back, None, None, None


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Scatters slices of ``tensor`` and gathers the slices sent here; differentiable.

    Returns the received slices concatenated in member order, or, when
    ``splits`` is given, ``(output, received_splits)`` as in Horovod.
    """
    output, received = _Alltoall.apply(_check(tensor, "alltoall"), splits, name, process_set)
    return output if splits is None else (output, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.reduction = (op, pre, post, process_set)
        return _call(_forms.REDUCESCATTER, tensor, grouped=False, in_place=False, wait=True, name=name, op=op,
                     prescale_factor=pre, postscale_factor=post, process_set=process_set)  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, pre, post, process_set = ctx.reduction
        _differentiable(op, "reducescatter")
        return _reducescatter_grad(grad, op, pre, post, process_set), None, None, None, None, None


def _scaled_for_reducescatter(grad: torch.Tensor, op: Any, pre: float, post: float, process_set: ProcessSet) -> Any:
    """``grad`` scaled as Horovod scales a reducescatter's output gradient (see ``reducescatter_gradient_scale``)."""
    scale = _forms.reducescatter_gradient_scale(op, pre, post, process_set.size())
    return grad.contiguous() * scale if scale != 1 else grad.contiguous()


def _reducescatter_grad(grad: torch.Tensor, op: Any, pre: float, post: float, process_set: ProcessSet) -> Any:
    return allgather(_scaled_for_reducescatter(grad, op, pre, post, process_set), process_set=process_set)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Compressor = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Returns this rank's slice of the reduction of ``tensor``; differentiable. See :func:`reducescatter_async`."""
    t = _check(tensor, "reducescatter")
    compressed, ctx = compression.compress(t)
    result = _Reducescatter.apply(
        compressed, name, _check_op(op, "reducescatter"), float(prescale_factor), float(postscale_factor), process_set
    )
    return compression.decompress(result, ctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Compressor = Compression.none,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Returns this rank's slices of the reductions of ``tensors``, computed as one unit; differentiable.

    The gradient of each tensor is that of :func:`reducescatter`, the
    gradients gathered as one unit.
    """
    packed = [compression.compress(t) for t in _tensors(tensors, "grouped_reducescatter")]
    op = _check_op(op, "grouped_reducescatter")
    results = _GroupedReducescatter.apply(
        name, op, float(prescale_factor), float(postscale_factor), process_set, *(c for c, _ in packed)
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, packed, strict=True)]


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, name: str | None, op: Any, pre: float, post: float, process_set: ProcessSet, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.reduction = (op, pre, post, process_set)
        handle = grouped_reducescatter_async(list(tensors), name, op, process_set, pre, post)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, pre, post, process_set = ctx.reduction
        _differentiable(op, "grouped_reducescatter")
        scaled = [_scaled_for_reducescatter(g, op, pre, post, process_set) for g in grads]
        return (None, None, None, None, None, *grouped_allgather(scaled, process_set=process_set))
