"""torch tensors as the engine and the request layer see them: the dtype table, host buffers, in-place writes.

A CPU tensor that is contiguous goes to the engine as it is: the engine
reads it, and in-place operations write into it, through a numpy view of
its storage (no copy). Any other tensor (non-contiguous, or on a GPU) is
staged through a contiguous host copy, pinned when CUDA is available, and
in-place results are copied back when the operation completes. Results the
engine allocates (allgather, alltoall, reducescatter) become tensors without
a copy and move to the input's device.

In-place forms behave as torch's own in-place ops do for autograd: with
grad mode on they refuse a leaf that requires grad (torch's message), every
write bumps the tensor's version counter (so a backward pass that saved the
old values raises instead of using the new ones), and a non-leaf that
requires grad gets the write recorded in its history (see "in-place
writes" below).

Private to ``hora.torch``: :class:`_Torch` is its adapter for
``hora._forms``; the collectives are in ``hora.torch.collectives`` and
``hora.torch.differentiable``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch
from hora import _forms, _native
from hora.compression import TensorHooks, register_tensor_hooks
from hora.handles import Request, Result
from hora.ops import Sum
from hora.process_sets import ProcessSet

_Kind = _native.RequestKind
_DataType = _native.DataType

# torch dtype -> (engine dtype, numpy dtype of the view the engine reads).
_DTYPES: dict[torch.dtype, tuple[_native.DataType, type]] = {
    torch.uint8: (_DataType.UINT8, np.uint8),
    torch.int8: (_DataType.INT8, np.int8),
    torch.int16: (_DataType.INT16, np.int16),
    torch.int32: (_DataType.INT32, np.int32),
    torch.int64: (_DataType.INT64, np.int64),
    torch.float16: (_DataType.FLOAT16, np.float16),
    torch.bfloat16: (_DataType.BFLOAT16, np.int16),  # numpy has no bfloat16: the engine reads its bits
    torch.float32: (_DataType.FLOAT32, np.float32),
    torch.float64: (_DataType.FLOAT64, np.float64),
    torch.bool: (_DataType.BOOL, np.bool_),
}
SUPPORTED_DTYPES = tuple(_DTYPES)
_NUMPY_DTYPES = frozenset(_DTYPES) - {torch.bfloat16}  # the engine reads their type from a numpy view's format

register_tensor_hooks(
    torch.Tensor,
    TensorHooks(
        is_floating=lambda t: t.is_floating_point(),
        dtype=lambda t: t.dtype,
        cast=lambda t, dtype: t.to(torch.float16 if dtype == "float16" else dtype),
    ),
)


# --- tensors as the engine sees them ---------------------------------------------------------


def _check(tensor: object, caller: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hora.torch.{caller} expects a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in _DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in _DTYPES)
        raise TypeError(f"hora.torch.{caller} does not support dtype {tensor.dtype}; supported dtypes: {names}.")
    if tensor.is_sparse:
        raise TypeError(f"hora.torch.{caller} needs a dense tensor; call .to_dense() on the sparse tensor first.")
    return tensor


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with ``tensor``'s values: ``tensor`` itself (detached) when it is one."""
    t = tensor.detach()
    if t.device.type == "cpu":
        return t if t.is_contiguous() else t.contiguous()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    host.copy_(t)
    return host


def _raw(host: torch.Tensor) -> np.ndarray:
    """The numpy view of ``host``'s storage that the engine reads and writes."""
    view = host.view(torch.int16) if host.dtype == torch.bfloat16 else host
    return view.numpy()


def _request(
    host: torch.Tensor,
    kind: _native.RequestKind,
    name: str,
    process_set: int,
    op: Any = Sum,
    pre: float = 1.0,
    post: float = 1.0,
    root: int = -1,
    splits: Sequence[int] = (),
) -> Request:
    """The engine request for ``host`` (the engine reads its shape from the view)."""
    return Request(kind, name, _raw(host), _DTYPES[host.dtype][0], op, pre, post, root, process_set, splits)


def _result(result: Result, like: torch.Tensor) -> torch.Tensor:
    """An engine-allocated result as a tensor of ``like``'s dtype and device (no copy on the CPU)."""
    tensor = torch.from_numpy(result.output.view(_DTYPES[like.dtype][1]))
    if like.dtype == torch.bfloat16:
        tensor = tensor.view(torch.bfloat16)
    tensor = tensor.reshape(result.shape)
    return tensor if like.device.type == "cpu" else tensor.to(like.device)


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of ``tensor``'s values, detached: what out-of-place forms reduce into."""
    return tensor.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)


# --- in-place writes, as autograd sees them --------------------------------------------------
#
# The engine writes through a numpy view, which autograd cannot see. So an
# in-place form checks what torch's own in-place ops check before writing,
# and afterwards tells autograd: a tensor that autograd does not track for
# this write gets its version counter bumped; a non-leaf that requires grad
# (with grad mode on) is written with ``Tensor.copy_``, so the write enters
# its history as torch's in-place ops do.

_LEAF = "a leaf Variable that requires grad is being used in an in-place operation."
_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation."


def _recorded(tensors: list[torch.Tensor], caller: str) -> list[bool]:
    """Which of ``tensors`` autograd must see written; raises, as torch does, for a leaf that requires grad."""
    if not torch.is_grad_enabled():
        return [False] * len(tensors)
    for t in tensors:
        if not t.requires_grad:
            continue
        base = t._base
        message = _LEAF if t.is_leaf else _VIEW_OF_LEAF if base is not None and base.is_leaf else None
        if message is not None:
            raise RuntimeError(
                f"{message} hora.torch.{caller} writes its result into the tensor: call it under torch.no_grad() "
                "(as broadcast_parameters does), or use the out-of-place form."
            )
    return [t.requires_grad for t in tensors]


def _in_place_host(tensor: torch.Tensor, recorded: bool) -> torch.Tensor:
    """Where the engine writes ``tensor``'s result: its own storage when it can, else a staging copy."""
    return _copy(tensor) if recorded else _host(tensor)


def _write_back(tensor: torch.Tensor, host: torch.Tensor, recorded: bool = False) -> torch.Tensor:
    """Makes the result in ``host`` ``tensor``'s value, with a new version (see above); returns ``tensor``."""
    if recorded:
        with torch.enable_grad():
            tensor.copy_(host)  # a write autograd records; no gradient flows back through the collective
    elif host.data_ptr() != tensor.data_ptr() or host.device != tensor.device:
        tensor.detach().copy_(host)  # the detached alias shares the version counter, so this bumps it
    else:
        torch.autograd.graph.increment_version(tensor)  # the engine wrote into the storage itself
    return tensor


def _unrecorded_cpu(tensor: object) -> bool:
    """Whether ``tensor`` is a dense CPU tensor of a dtype numpy has whose write autograd would not record.

    Such a tensor, when contiguous, is its own host buffer; a copy of it
    (the out-of-place forms' staging) is one in any case.
    """
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.is_cpu
        and tensor.layout is torch.strided
        and tensor.dtype in _NUMPY_DTYPES
        and not (tensor.requires_grad and torch.is_grad_enabled())
    )


def _run_in_place(
    spec: _forms.Spec,
    tensor: object,
    name: str | None,
    process_set: ProcessSet,
    op: Any = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    root_rank: int = -1,
    *,
    bump_version: bool = True,
) -> bool:
    """The blocking in-place form on ``tensor`` in one native call (:func:`hora._forms.run_in_place`), if it can.

    It can when ``tensor`` is its own host buffer (a contiguous
    :func:`_unrecorded_cpu` tensor): the engine writes its storage through a
    numpy view, and, with ``bump_version`` (a tensor the user holds, not an
    out-of-place form's fresh copy), the write bumps its version counter as
    the checked path's does. False, having done nothing, otherwise.
    """
    if not (_unrecorded_cpu(tensor) and tensor.is_contiguous()):
        return False
    view = tensor.detach().numpy()
    if not _forms.run_in_place(spec, view, name, process_set, op, prescale_factor, postscale_factor, root_rank):
        return False
    if bump_version:
        torch.autograd.graph.increment_version(tensor)
    return True


def _blocking_in_place(
    tensors: list[torch.Tensor],
    single: bool,
    caller: str,
    differentiable_form: Callable[[ModuleType], Any],
    engine_form: Callable[[], Any],
) -> Any:
    """Runs a blocking in-place form (``allreduce_``, ``grouped_allreduce_``, ``broadcast_``) and returns its result.

    Usually that is ``engine_form()``, which writes through the engine. When
    a tensor is in autograd's graph, the result comes instead from
    ``differentiable_form(hora.torch.differentiable)`` (a tensor, or a list
    when not ``single``) and is written with ``copy_``, so the in-place op
    carries the collective's gradient, as torch's own in-place ops carry
    theirs. The asynchronous in-place forms record their write as a copy: no
    gradient flows back through them.
    """
    if not any(_recorded(tensors, caller)):
        return engine_form()
    from hora.torch import differentiable  # imports this module, so not at the top

    result = differentiable_form(differentiable)
    if single:
        return tensors[0].copy_(result)
    return [t.copy_(r) for t, r in zip(tensors, result, strict=True)]


def _tensors(tensors: object, caller: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
        raise TypeError(f"hora.torch.{caller} expects a list of tensors, got {type(tensors).__name__}.")
    return [_check(t, caller) for t in tensors]


def _reduce_op(op: Any, average: bool | None, caller: str) -> Any:
    """Horovod's ``op``/``average`` pair as one op (see :func:`hora._forms.horovod_op`)."""
    return _forms.horovod_op(op, average, f"torch.{caller}")


# --- torch tensors as the request layer sees them (hora._forms) -----------------------------------


class _Staged:
    """The host tensors of one call, and how the call's outputs come out of them."""

    __slots__ = ("_recorded", "_tensors", "hosts", "in_place")

    def __init__(self, tensors: list[torch.Tensor], caller: str, in_place: bool, writes: bool) -> None:
        self._tensors, self.in_place = tensors, in_place
        self._recorded = _recorded(tensors, caller) if in_place else [False] * len(tensors)
        if in_place:
            self.hosts = [_in_place_host(t, r) for t, r in zip(tensors, self._recorded, strict=True)]
        elif writes:  # the copy forms of allreduce and broadcast reduce into fresh copies
            self.hosts = [_copy(t) for t in tensors]
        else:
            self.hosts = [_host(t) for t in tensors]

    def written(self) -> list[torch.Tensor]:
        if self.in_place:
            return [_write_back(t, h, r) for t, h, r in zip(self._tensors, self.hosts, self._recorded, strict=True)]
        return [h if t.device.type == "cpu" else h.to(t.device) for t, h in zip(self._tensors, self.hosts, strict=True)]


class _Torch:
    """The request layer's adapter for torch tensors."""

    def check(self, tensor: object, caller: str, min_dims: int) -> torch.Tensor:
        t = _check(tensor, caller)
        if t.dim() < min_dims:
            raise ValueError(f"hora.torch.{caller} needs tensors with at least one dimension; got a scalar.")
        return t

    def sequence(self, tensors: object, caller: str) -> list[object]:
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
            raise TypeError(f"hora.torch.{caller} expects a list of tensors, got {type(tensors).__name__}.")
        return list(tensors)

    def stage(self, tensors: list[torch.Tensor], caller: str, *, in_place: bool, writes: bool) -> _Staged:
        return _Staged(tensors, caller, in_place, writes)

    def request(self, host: torch.Tensor, caller: str, kind: _native.RequestKind, name: str, process_set: int,
                op: Any, pre: float, post: float, root: int, splits: Sequence[int]) -> Request:  # fmt: skip
        return _request(host, kind, name, process_set, op, pre, post, root, splits)

    output = staticmethod(_result)

    def alltoall_output(self, output: torch.Tensor, result: Result, splits_given: bool) -> Any:
        return output, torch.tensor(result.received_splits, dtype=torch.int32)

    def splits(self, splits: object) -> object:
        return splits.tolist() if isinstance(splits, torch.Tensor) else splits


_TORCH = _Torch()
