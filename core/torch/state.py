"""Making every rank start from the root's model and optimizer state.

``broadcast_parameters`` overwrites tensors in place with the root's.
``broadcast_optimizer_state`` gives the root's optimizer state and
hyperparameters to every rank, with Horovod 0.28.1's numbers: an optimizer
whose state is still empty first takes one step on zero gradients to
create it (as Horovod's does: Adam's step count starts at 1, and weight
decay moves the parameters), and when the root's keeps no state even then
(plain SGD) nothing is sent. Otherwise it sends the root's whole ``state_dict()``: its structure
(hyperparameters, step counts, any Python values) as one pickled object,
and its tensors natively, each in place of a placeholder, so large moment
buffers never go through pickle. Every other rank then loads it.
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
from hora.torch._tensors import SUPPORTED_DTYPES
from hora.torch.collectives import broadcast_async_
from hora.torch.optimizer import _DistributedOptimizer

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
    """Makes ``optimizer``'s state and hyperparameters on every rank those of ``root_rank``, as Horovod does.

    An optimizer with no state yet (one that has not stepped) is first given
    it as Horovod gives it: every parameter that requires grad gets a zero
    gradient (sparse for ``SparseAdam``), which stays on it, and the
    optimizer takes one step (a DistributedOptimizer the wrapped class's
    step, which exchanges nothing). So a fresh Adam's step count is 1 after
    this call, and with weight decay the parameters move. If the root's
    optimizer still has no state (plain SGD), nothing is sent and every rank
    keeps its own hyperparameters, as in Horovod. Every rank's optimizer
    must have the same parameter groups.

    Args:
        optimizer: a ``torch.optim`` optimizer or a DistributedOptimizer; not ``LBFGS``.
        root_rank: the rank whose state wins.
        prefix: prepended to each broadcast's name, to keep two calls' names apart.

    Raises:
        ValueError: for ``torch.optim.LBFGS``, which Horovod refuses too.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state expects a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            "broadcast_optimizer_state refuses torch.optim.LBFGS, as Horovod does (its step needs a closure, and "
            "its state nests lists and None). Send it as one object instead: state = "
            "hvd.broadcast_object(optimizer.state_dict(), root_rank), then optimizer.load_state_dict(state) on the "
            "other ranks."
        )
    root = check_root(root_rank, size(), "broadcast_optimizer_state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _initialize_state(optimizer)
        state_dict = optimizer.state_dict()
    tensors: list[torch.Tensor] = []
    structure = _strip(state_dict, tensors) if rank() == root else None
    structure = broadcast_object(structure, root, name=f"optimizer_state.{prefix}structure")
    if not structure["state"]:
        return  # a stateless optimizer: Horovod broadcasts nothing, not even the hyperparameters
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


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Creates a new optimizer's state as Horovod 0.28.1 does: one step on zero gradients.

    Every parameter that requires grad gets a zero gradient, replacing any it
    had, and keeps it afterwards (code written for Horovod reads or
    broadcasts ``p.grad`` after the call). A DistributedOptimizer takes the
    wrapped class's step: its own would wait for gradient exchanges that the
    other ranks never start.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                zeros = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
                p.grad = zeros.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) else zeros
    if isinstance(optimizer, _DistributedOptimizer):
        super(_DistributedOptimizer, optimizer).step()
    else:
        optimizer.step()


def _collect_slots(value: Any, slots: list[_TensorSlot]) -> None:
    if isinstance(value, _TensorSlot):
        slots.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_slots(v, slots)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_slots(v, slots)
