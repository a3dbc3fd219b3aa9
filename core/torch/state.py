"""Making every rank start from the root's model and optimizer state.

``broadcast_parameters`` overwrites tensors in place with the root's.
``broadcast_optimizer_state`` sends the root's whole ``state_dict()``: its
structure (hyperparameters, step counts, any Python values) as one pickled
object, and its tensors natively, each in place of a placeholder, so large
moment buffers never go through pickle. Every rank then loads it, so an
optimizer with no state yet, or with scalar state, or with parameters that
have no state, ends up identical too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from hora._arrays import check_root
from hora.basics import rank, size
from hora.handles import synchronize
from hora.objects import broadcast_object
from hora.torch.collectives import SUPPORTED_DTYPES, broadcast_async_

__all__ = ["broadcast_optimizer_state", "broadcast_parameters"]


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0, prefix: str = ""
) -> None:
    """Overwrites every tensor of ``params`` with its value on ``root_rank``, in place.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()`` or a list of tensors
            (``model.parameters()``); the same names (or order) on every rank.
        root_rank: the rank whose values win.
        prefix: prepended to each broadcast's name, to keep two calls' names apart.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable):
        # As in Horovod, bare tensors (model.parameters()) are named by their position.
        items = [item if isinstance(item, tuple) else (f"noname.{i}", item) for i, item in enumerate(params)]
        if any(len(item) != 2 for item in items):
            raise ValueError("broadcast_parameters expects a state_dict or a list of (name, tensor) pairs.")
    else:
        raise ValueError(
            f"broadcast_parameters expects a state_dict or model.named_parameters(), got {type(params).__name__}."
        )
    handles = []
    # Parameters are leaves that require grad: overwriting them is not part of any graph.
    with torch.no_grad():
        for name, tensor in items:
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor.")
            handles.append(broadcast_async_(tensor, root_rank, name=f"broadcast.{prefix}{name}"))
    for handle in handles:
        synchronize(handle)


@dataclass(frozen=True)
class _TensorSlot:
    """Stands for the root's tensor number ``index`` in the broadcast structure."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _strip(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a slot; the tensors are appended to ``tensors``.

    Tensors of a dtype the engine cannot send (complex, say) stay in place and travel pickled.
    """
    if isinstance(value, torch.Tensor) and value.dtype in SUPPORTED_DTYPES:
        tensors.append(value)
        return _TensorSlot(len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_strip(v, tensors) for v in value)
    return value


def _fill(value: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of :func:`_strip`."""
    if isinstance(value, _TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0, prefix: str = "") -> None:
    """Makes ``optimizer``'s state and hyperparameters on every rank those of ``root_rank``.

    Works for any ``torch.optim`` optimizer (or a DistributedOptimizer),
    including one that has not taken a step yet and state that holds Python
    scalars. Every rank's optimizer must have the same parameter groups.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state expects a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    root = check_root(root_rank, size(), "broadcast_optimizer_state")
    if not optimizer.state:
        _zero_missing_gradients(optimizer)
    tensors: list[torch.Tensor] = []
    structure = _strip(optimizer.state_dict(), tensors) if rank() == root else None
    structure = broadcast_object(structure, root, name=f"optimizer_state.{prefix}structure")
    if rank() != root:
        slots: list[_TensorSlot] = []
        _collect_slots(structure, slots)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in sorted(slots, key=lambda s: s.index)]
    sendable = [t.detach().cpu().contiguous() for t in tensors]
    handles = [broadcast_async_(t, root, name=f"optimizer_state.{prefix}{i}") for i, t in enumerate(sendable)]
    for handle in handles:
        synchronize(handle)
    if rank() == root:
        return
    state = _fill(structure, sendable)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise ValueError(
            f"broadcast_optimizer_state: rank {root_rank}'s optimizer state does not fit this rank's optimizer "
            f"({type(optimizer).__name__} with {[len(g['params']) for g in optimizer.param_groups]} parameters per "
            "group); every rank must build the same optimizer over the same model."
        ) from exc


def _zero_missing_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Gives every parameter that requires grad and has no gradient a zero one, as Horovod does here.

    Horovod initialises a new optimizer's state by taking a step on zero
    gradients, which leaves them on the parameters; code written for it
    reads (or broadcasts) ``p.grad`` after this call. Hora sends the root's
    state as it is instead of taking that step, which would change Adam's
    step count and move parameters under weight decay.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                zeros = torch.zeros_like(p)
                p.grad = zeros.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) else zeros


def _collect_slots(value: Any, slots: list[_TensorSlot]) -> None:
    if isinstance(value, _TensorSlot):
        slots.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_slots(v, slots)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_slots(v, slots)
