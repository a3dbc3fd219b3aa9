"""DistributedOptimizer: averages gradients across ranks while backward is still running.

Wrapping an optimizer registers a hook on every parameter that fires once
its gradient has been accumulated (``register_post_accumulate_grad_hook``).
After ``backward_passes_per_step`` such passes the gradient is ready. Ready
gradients go to the engine in bursts: one call into the engine for each
``_BURST_BYTES`` of them, and one for the rest when the backward pass ends
(a callback autograd runs then), so a model with hundreds of small
parameters pays one crossing instead of hundreds, and large gradients still
start their allreduce while the backward pass goes on. Each gradient stays
its own request, named after its parameter. (With ``groups``, a group is
submitted as one unit once its last member is ready.) ``step()`` first
waits for every allreduce (``synchronize()``), then runs the wrapped
optimizer's update.

Gradients are matched across ranks by name (``allreduce.<parameter name>``),
so ranks may finish them in different orders. A parameter that got no
gradient in a step still takes part, with zeros, because another rank may
have computed one. Sparse gradients stay sparse: their indices and values
are allgathered (``hora.torch.sparse_allreduce_async``) unless
``sparse_as_dense``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from hora._arrays import _check_op
from hora.compression import Compression, Compressor
from hora.handles import Handle
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set
from hora.torch.collectives import allreduce_burst_async_, grouped_allreduce_async_
from hora.torch.sparse import SparseHandle, sparse_allreduce_async

__all__ = ["DistributedOptimizer"]

# Ready gradients are submitted once this many bytes of them are waiting (and at the end of backward).
_BURST_BYTES = 1 << 20


class _DistributedOptimizer:
    """The behaviour mixed into the wrapped optimizer's class (see :func:`DistributedOptimizer`)."""

    def __init__(self, params: Any, named_parameters: Sequence[tuple[str, torch.Tensor]] | None,
                 compression: Compressor, backward_passes_per_step: int, op: Any, gradient_predivide_factor: float,
                 groups: int | Sequence[Sequence[torch.Tensor]] | None, sparse_as_dense: bool,
                 process_set: ProcessSet) -> None:  # fmt: skip
        super().__init__(params)  # type: ignore[call-arg]
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._op = _check_op(op, "DistributedOptimizer")
        if gradient_predivide_factor != 1.0 and self._op != Average:
            raise ValueError(
                f"gradient_predivide_factor={gradient_predivide_factor} needs op=hora.Average, got op={self._op}."
            )
        # As in Horovod: divide before the sum and multiply after; Average divides by the size too.
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = float(gradient_predivide_factor)
        params_in_order = [p for group in self.param_groups for p in group["params"]]
        self._names = _parameter_names(params_in_order, named_parameters)
        self._groups = _parameter_groups(params_in_order, groups)
        # parameter -> (its group's index, its position in the group)
        self._group_of = {p: (index, at) for index, group in enumerate(self._groups) for at, p in enumerate(group)}
        self._requires_update = [p for p in params_in_order if p.requires_grad]
        self.set_backward_passes_per_step(backward_passes_per_step)
        # parameter -> (the handle carrying its gradient, its index in the handle's list or None, compression ctx)
        self._handles: dict[torch.Tensor, tuple[Handle, int | None, Any]] = {}
        self._burst: list[tuple[torch.Tensor, torch.Tensor, Any]] = []  # (parameter, compressed gradient, ctx)
        self._burst_bytes = 0
        self._flush_queued = -1  # the id of the backward pass whose end will flush the burst
        self._ready: dict[int, set[torch.Tensor]] = {}  # group index -> members whose gradient is ready
        self._densified: dict[torch.Tensor, int] = {}  # sparse gradient sent dense -> its sparse_dim
        self._should_synchronize = True
        self._synchronized = False
        # As in Horovod, a rank outside the process set exchanges nothing: its optimizer steps on its own
        # gradients, so it neither starts exchanges the members would never match nor waits for them.
        self._member = process_set.included()
        if self._member:
            for p in self._requires_update:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Sets how many backward passes accumulate locally before gradients are exchanged."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}.")
        self.backward_passes_per_step = passes
        self._delay = {p: passes for p in self._requires_update}

    # --- gradient exchange ------------------------------------------------------------------

    def _gradient_ready(self, p: torch.Tensor) -> None:
        if self._delay[p] <= 0:
            raise RuntimeError(
                f"The gradient of {self._names[p]!r} was computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} times before optimizer.step(). Increase backward_passes_per_step "
                "to accumulate gradients locally, or call optimizer.step() (or synchronize()) after each backward."
            )
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._start(p)
            # Submit what is left when this backward pass ends (once per pass: a pass that raised never ran its
            # callback, so the flag is the pass's id, not a boolean).
            task = torch._C._current_graph_task_id()
            if self._burst and self._flush_queued != task:
                torch.autograd.Variable._execution_engine.queue_callback(self._flush)
                self._flush_queued = task

    def _start(self, p: torch.Tensor) -> None:
        """Starts the exchange of ``p``'s gradient, or of its group's once the whole group is ready."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # another rank may have a gradient for it
        if p not in self._group_of:
            self._add_to_burst(p)
            return
        index = self._group_of[p][0]
        ready = self._ready.setdefault(index, set())
        ready.add(p)
        group = self._groups[index]
        if len(ready) == len(group):
            del self._ready[index]
            packed = [self._compression.compress(self._dense_grad(q)) for q in group]
            handle = grouped_allreduce_async_(
                [c for c, _ in packed], name=f"grouped_allreduce.group{index}", op=self._op,
                prescale_factor=self._prescale, postscale_factor=self._postscale, process_set=self._process_set,
            )  # fmt: skip
            for at, (q, (_, ctx)) in enumerate(zip(group, packed, strict=True)):
                self._handles[q] = (handle, at, ctx)

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad.is_sparse:  # sparse_as_dense, or a member of a group: sparse again after the exchange
            self._densified[p] = p.grad.sparse_dim()
            p.grad = p.grad.to_dense()
        return p.grad

    def _add_to_burst(self, p: torch.Tensor) -> None:
        if p.grad.is_sparse and not self._sparse_as_dense:
            self._handles[p] = (self._sparse_allgather(p), None, None)
            return
        compressed, ctx = self._compression.compress(self._dense_grad(p))
        self._burst.append((p, compressed, ctx))
        self._burst_bytes += compressed.element_size() * compressed.numel()
        if self._burst_bytes >= _BURST_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Submits the waiting gradients' allreduces in one call into the engine."""
        burst, self._burst, self._burst_bytes = self._burst, [], 0
        if not burst:
            return
        handle = allreduce_burst_async_(
            [c for _, c, _ in burst], [f"allreduce.{self._names[p]}" for p, _, _ in burst], op=self._op,
            prescale_factor=self._prescale, postscale_factor=self._postscale, process_set=self._process_set,
        )  # fmt: skip
        for at, (p, _, ctx) in enumerate(burst):
            self._handles[p] = (handle, at, ctx)

    def _sparse_allgather(self, p: torch.Tensor) -> SparseHandle:
        """A sparse gradient travels as its indices and values, gathered from every member (as in Horovod)."""
        return sparse_allreduce_async(p.grad, f"sparse.{self._names[p]}", self._op, self._process_set)

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce (starting those of parameters whose hooks did not fire).

        On a rank outside the process set it does nothing, as in Horovod.
        """
        if not self._member:
            self._synchronized = True
            return
        self._flush()  # normally done when backward ended; not when a hook's gradient came another way
        for p in self._requires_update:
            if p not in self._handles:
                self._start(p)  # no gradient on this rank this step, or fewer passes than configured
        self._flush()
        try:
            for p, (handle, at, ctx) in self._handles.items():
                output = handle.wait()
                if at is not None:  # a handle of several gradients: this parameter's entry
                    output = output[at]
                if output is not p.grad:
                    restored = self._compression.decompress(output, ctx)
                    if p.grad.is_sparse or restored.is_sparse:
                        p.grad = restored
                    else:
                        p.grad.copy_(restored)
            # An optimizer for sparse gradients (SparseAdam) needs them sparse, as Horovod gives them back.
            for p, sparse_dim in self._densified.items():
                p.grad = p.grad.to_sparse(sparse_dim)
        finally:
            self.reset_exchange()
        self._synchronized = True

    def reset_exchange(self) -> None:
        """Forgets every gradient exchange in flight or half-started, so the next backward pass starts afresh.

        ``synchronize()`` ends with it. An elastic job also needs it after a
        collective failed mid-step (in backward, between backward and step):
        :class:`~hora.torch.elastic.TorchState` calls it when it restores the
        optimizer, since the handles belong to the job that failed.
        """
        self._densified.clear()
        self._handles.clear()
        self._burst, self._burst_bytes = [], 0
        self._ready.clear()
        self._delay = {p: self.backward_passes_per_step for p in self._requires_update}

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this context, ``step()`` does not call ``synchronize()`` (call it yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Waits for the gradients' allreduce (unless within ``skip_synchronize()``), then updates."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() was called after optimizer.synchronize() without optimizer.skip_synchronize(); "
                    "the gradients are exchanged again, which slows training. Use `with optimizer.skip_synchronize(): "
                    "optimizer.step()` after calling synchronize() yourself.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the gradients; refuses while their allreduce is in flight (it would race with it)."""
        if self._handles or self._burst:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); the gradients' allreduce is still in flight. Call step() first."
            )
        super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


def _parameter_names(
    params: list[torch.Tensor], named_parameters: Sequence[tuple[str, torch.Tensor]] | None
) -> dict[torch.Tensor, str]:
    """Each parameter's name, the same on every rank: the given names, or its position in the optimizer."""
    if named_parameters is None:
        return {p: f"noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not (isinstance(item, tuple) and len(item) == 2) for item in named):
        raise ValueError(
            "named_parameters must be a list of (name, parameter) pairs, as model.named_parameters() gives."
        )
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {duplicates}; every parameter needs its own name.")
    by_param = {p: n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if p not in by_param]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but the optimizer's parameters at positions {unnamed} are not named in it; "
            "pass model.named_parameters() of the model whose parameters the optimizer updates."
        )
    return {p: by_param[p] for p in params}


def _parameter_groups(
    params: list[torch.Tensor], groups: int | Sequence[Sequence[torch.Tensor]] | None
) -> list[list[torch.Tensor]]:
    """The groups whose gradients are exchanged together: ``groups`` equal slices, or the lists given."""
    trainable = [p for p in params if p.requires_grad]
    if groups is None or groups == 0:
        return []
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(f"groups must be a positive number of groups or a list of parameter lists, got {groups}.")
        count = min(groups, len(trainable))
        return [g for g in (trainable[i::count] for i in range(count)) if g] if count else []
    if not isinstance(groups, Iterable):
        raise ValueError(f"groups must be a number of groups or a list of parameter lists, got {groups!r}.")
    result = [list(group) for group in groups]
    seen: set[torch.Tensor] = set()
    for index, group in enumerate(result):
        for p in group:
            if all(p is not q for q in trainable):
                raise ValueError(f"groups[{index}] holds a tensor that is not a trainable parameter of the optimizer.")
            if p in seen:
                raise ValueError(f"groups[{index}] repeats a parameter of an earlier group; each may be in one group.")
            seen.add(p)
    return [g for g in result if g]


def DistributedOptimizer(  # noqa: N802 - Horovod's name for a factory
    optimizer: torch.optim.Optimizer,
    named_parameters: Sequence[tuple[str, torch.Tensor]] | Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Compressor = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that ``step()`` uses gradients averaged across ranks.

    The result is an instance of ``optimizer``'s class (so ``isinstance``
    checks and ``state_dict()`` work) over the same parameter groups and state.

    Args:
        optimizer: any ``torch.optim`` optimizer.
        named_parameters: ``model.named_parameters()``; names tensors across ranks (default: by position).
        compression: ``Compression.fp16`` sends gradients as float16.
        backward_passes_per_step: backward passes accumulated locally between exchanges.
        op: ``hora.Average`` (default), ``hora.Sum``, or another reduction.
        gradient_predivide_factor: with Average, divide by this before the sum and by size/this after.
        num_groups: Horovod's older spelling of ``groups`` as a number.
        groups: exchange gradients in this many groups, or in the given lists of parameters,
            each group as one fused unit once all its gradients are ready.
        sparse_as_dense: exchange sparse gradients as dense tensors (otherwise they are allgathered).
        process_set: the ranks that average their gradients (default: all). On a rank outside it the
            optimizer exchanges nothing and steps on that rank's own gradients, as in Horovod.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    if num_groups and groups is not None:
        raise ValueError("Pass groups or the older num_groups, not both.")
    named = list(named_parameters) if named_parameters is not None else None
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped = cls(
        optimizer.param_groups, named, compression, backward_passes_per_step, op, gradient_predivide_factor,
        groups if groups is not None else num_groups, sparse_as_dense, process_set,
    )  # fmt: skip
    wrapped.defaults = optimizer.defaults
    if optimizer.state:
        wrapped.load_state_dict(optimizer.state_dict())
    return wrapped
