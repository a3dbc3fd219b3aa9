"""Collectives on torch tensors, run by the same engine as the numpy API: the asynchronous and in-place forms.

How a tensor reaches the engine (as it is, or through a host copy) and how
in-place writes behave for autograd is ``hora.torch._tensors``. Under
``torch.no_grad()`` the in-place forms write into parameters, as
``broadcast_parameters`` does.

Every function has Horovod's name and signature. The plain, differentiable
forms are in ``hora.torch.differentiable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hora import _forms
from hora._arrays import _check_op
from hora.basics import current_job
from hora.handles import Handle, Result, submit
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set, set_id
from hora.torch._tensors import (
    _TORCH,
    _blocking_in_place,
    _check,
    _in_place_host,
    _Kind,
    _recorded,
    _reduce_op,
    _request,
    _run_in_place,
    _tensors,
    _write_back,
)

__all__ = [
    "allgather_async",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather_async",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "reducescatter_async",
]
_ALLREDUCE, _ALLGATHER, _BROADCAST = _forms.ALLREDUCE, _forms.ALLGATHER, _forms.BROADCAST
_ALLTOALL, _REDUCESCATTER = _forms.ALLTOALL, _forms.REDUCESCATTER


# --- allreduce -------------------------------------------------------------------------------


def _call(spec: _forms.Spec, given: object, **form: Any) -> Any:
    """Every form of a torch collective (see :func:`hora._forms.call`)."""
    return _forms.call(spec, given, adapter=_TORCH, **form)


def allreduce_burst_async_(
    tensors: Sequence[torch.Tensor],
    names: Sequence[str],
    op: Any = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts an in-place allreduce of each tensor under its own name, all in one call into the engine.

    Unlike a grouped allreduce, the tensors are independent requests (each
    matched across ranks by its name, whichever burst another rank submits
    it in); only the crossing into the engine is shared, which is what a
    framework adapter needs for the gradients that become ready together.
    ``synchronize`` returns the list of tensors. Private to the adapters.
    """
    caller = "allreduce_async_"
    tensors = _tensors(tensors, caller)
    recorded = _recorded(tensors, caller)
    hosts = [_in_place_host(t, r) for t, r in zip(tensors, recorded, strict=True)]
    ps = set_id(process_set, caller)
    op = _check_op(op, caller)
    pre, post = float(prescale_factor), float(postscale_factor)
    requests = [_request(h, _Kind.ALLREDUCE, n, ps, op, pre, post) for h, n in zip(hosts, names, strict=True)]

    def finish(results: list[Result]) -> list[torch.Tensor]:
        return [_write_back(t, h, r) for t, h, r in zip(tensors, hosts, recorded, strict=True)]

    return submit(current_job(), requests, finish, group="")


def _allreduce(given: Any, *, grouped: bool, in_place: bool, wait: bool, average: bool | None, name: str | None,
               op: Any, prescale_factor: float, postscale_factor: float, process_set: ProcessSet) -> Any:  # fmt: skip
    """The public allreduce forms: Horovod's ``op``/``average`` pair, and autograd for the blocking in-place ones."""
    caller = _ALLREDUCE.callers[grouped, in_place]
    op = _reduce_op(op, average, caller)
    if (
        in_place
        and wait
        and not grouped
        and _run_in_place(_ALLREDUCE, given, name, process_set, op, prescale_factor, postscale_factor)
    ):
        return given

    def engine_form() -> Any:
        # Not through _call: passing a dict on as **form costs ~1 µs a call (measured), and these forms are
        # the ones called per tensor.
        return _forms.call(_ALLREDUCE, given, adapter=_TORCH, grouped=grouped, in_place=in_place, wait=wait,
                           name=name, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                           process_set=process_set)  # fmt: skip

    if not (in_place and wait):
        return engine_form()
    tensors = _tensors(given, caller) if grouped else [_check(given, caller)]
    form = {"name": name, "op": op, "prescale_factor": prescale_factor, "postscale_factor": postscale_factor,
            "process_set": process_set}  # fmt: skip
    return _blocking_in_place(
        tensors, not grouped, caller,
        lambda d: d.grouped_allreduce(tensors, **form) if grouped else d.allreduce(tensors[0], **form),
        engine_form,
    )  # fmt: skip


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing ``tensor`` across ranks; ``synchronize(handle)`` returns a new tensor with the result.

    Args:
        tensor: the same shape and dtype on every rank.
        average: Horovod's older spelling of ``op``: True for Average, False for Sum.
        name: matched across ranks (default: an automatic name).
        op: hora.Average (default), Sum, Min, Max or Product.
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: the ranks that take part (default: all).
    """
    return _allreduce(tensor, grouped=False, in_place=False, wait=False, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`allreduce_async`, but the result is written into ``tensor``, which the handle returns."""
    return _allreduce(tensor, grouped=False, in_place=True, wait=False, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduces ``tensor`` in place across ranks and returns it.

    With grad mode on, a tensor that requires grad gets the allreduce's
    gradient, as with torch's own in-place ops; a leaf that requires grad is
    refused (call it under ``torch.no_grad()``). The asynchronous in-place
    forms record their write as a copy: no gradient flows back through them.
    """
    return _allreduce(tensor, grouped=False, in_place=True, wait=True, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Starts reducing every tensor of ``tensors`` as one unit; ``synchronize`` returns the list of results."""
    return _allreduce(tensors, grouped=True, in_place=False, wait=False, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Like :func:`grouped_allreduce_async`, but in place: ``synchronize`` returns ``tensors``."""
    return _allreduce(tensors, grouped=True, in_place=True, wait=False, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduces every tensor of ``tensors`` in place as one unit and returns them."""
    return _allreduce(tensors, grouped=True, in_place=True, wait=True, average=average, name=name,
                      op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)  # fmt: skip


# --- allgather -------------------------------------------------------------------------------


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts concatenating every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others, and the dtype, must match.
    """
    return _call(_ALLGATHER, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts an allgather of every tensor of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _call(_ALLGATHER, tensors, grouped=True, in_place=False, wait=False, name=name, process_set=process_set)


# --- broadcast -------------------------------------------------------------------------------


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts broadcasting ``root_rank``'s ``tensor``; ``synchronize`` returns a new tensor with its value."""
    return _call(_BROADCAST, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts overwriting ``tensor`` with ``root_rank``'s; ``synchronize`` returns ``tensor``."""
    return _call(_BROADCAST, tensor, grouped=False, in_place=True, wait=False, name=name, process_set=process_set,
                 root_rank=root_rank)  # fmt: skip


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Overwrites ``tensor`` with ``root_rank``'s and returns it.

    With grad mode on, a tensor that requires grad gets the broadcast's
    gradient, as with torch's own in-place ops; a leaf that requires grad is
    refused (call it under ``torch.no_grad()``).
    """
    t = _check(tensor, "broadcast_")
    if _run_in_place(_BROADCAST, t, name, process_set, root_rank=root_rank):
        return t
    return _blocking_in_place(
        [t], True, "broadcast_",
        lambda d: d.broadcast(t, root_rank, name=name, process_set=process_set),
        lambda: _call(_BROADCAST, t, grouped=False, in_place=True, wait=True, name=name, process_set=process_set,
                      root_rank=root_rank),
    )  # fmt: skip


# --- alltoall --------------------------------------------------------------------------------


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Starts an alltoall; ``synchronize`` returns ``(output, received_splits)``.

    Slice ``i`` of ``tensor`` (along the first dimension, ``splits[i]`` rows;
    even slices without ``splits``) goes to member ``i`` of the process set.
    """
    return _call(_ALLTOALL, tensor, grouped=False, in_place=False, wait=False, name=name, process_set=process_set,
                 splits=splits)  # fmt: skip


# --- reducescatter ---------------------------------------------------------------------------


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts a reducescatter; ``synchronize`` returns this rank's slice of the reduction.

    The first dimension is split as evenly as possible over the members; the
    first ``shape[0] % members`` get one extra row.
    """
    return _call(_REDUCESCATTER, tensor, grouped=False, in_place=False, wait=False, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: Any = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Starts a reducescatter of every tensor of ``tensors`` as one unit; ``synchronize`` returns the list."""
    return _call(_REDUCESCATTER, tensors, grouped=True, in_place=False, wait=False, name=name,
                 process_set=process_set, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor)  # fmt: skip
