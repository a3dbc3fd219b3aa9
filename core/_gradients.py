"""A training step's gradients combined across ranks: Horovod's rules, written once for every framework.

Gradients of every rank combine with ``op`` (Average by default);
``gradient_predivide_factor`` splits the averaging into a division before
the sum and the rest after it; ``None`` gradients stay ``None``; a rank
outside ``process_set``, or a set of one rank, keeps its gradients
unchanged. Where Horovod reduces each gradient separately unless told to
group them, Hora sends all of a step's gradients as one group (one crossing
to the engine, one buffer per dtype), or ``groups`` of them when asked: the
same numbers, far fewer crossings. A framework supplies how a group is
reduced (and how a sparse gradient becomes dense).

Private: used by ``hora.tensorflow`` (the tape) and ``hora.keras`` (the optimizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hora import _forms
from hora.compression import Compression, Compressor
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set, set_id

__all__ = ["GradientExchange"]


class GradientExchange:
    """Combines the gradients of a step across the ranks of ``process_set``.

    Args:
        compression: ``Compression.fp16`` sends floating-point gradients as float16.
        sparse_as_dense: reduce sparse gradients as dense tensors instead of allgathering them.
        op: hora.Average (default), Sum, Min, Max or Product.
        gradient_predivide_factor: with Average, divide by this before the
            sum and by ``size / factor`` after it.
        groups: an int: split the gradients into that many groups, each sent
            as one unit; a list of lists of variables: those variables'
            gradients form a group each, every other gradient its own.
            Default (None or 0): all of them in one group.
        process_set: the ranks that exchange gradients.
        caller: the public name quoted in messages (``"tensorflow.DistributedGradientTape"``).
    """

    def __init__(
        self,
        *,
        compression: Compressor = Compression.none,
        sparse_as_dense: bool = False,
        op: Any = Average,
        gradient_predivide_factor: float = 1.0,
        groups: int | Sequence[Sequence[Any]] | None = None,
        process_set: ProcessSet = global_process_set,
        caller: str,
    ) -> None:
        op = _forms.horovod_op(op, None, caller)
        set_id(process_set, caller)
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError(
                f"hora.{caller}: gradient_predivide_factor={gradient_predivide_factor} needs op=Average (got {op})."
            )
        if groups is not None and not isinstance(groups, (int, list, tuple)):
            raise ValueError(f"hora.{caller}: groups must be an int or a list of lists of variables, got {groups!r}.")
        if isinstance(groups, int) and groups < 0:
            raise ValueError(f"hora.{caller}: groups must be positive, got {groups}.")
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        # Average: the engine divides by the set size after the sum; these split it as Horovod does.
        self.prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
        self.postscale = float(gradient_predivide_factor) if op == Average else 1.0
        self.groups = groups or None
        self.process_set = process_set

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The framework's part: ``grads`` (none of them None) combined across ranks as one unit."""
        raise NotImplementedError

    def densify(self, grad: Any) -> Any:
        """The framework's part: ``grad`` as a dense tensor when it is sparse (for ``sparse_as_dense``)."""
        return grad

    def __call__(self, grads: Sequence[Any], variables: Sequence[Any] | None = None) -> list[Any]:
        """The combined ``grads`` (one per variable of ``variables``, which ``groups`` of variables need)."""
        grads = list(grads)
        if not self.process_set.included() or self.process_set.size() == 1:
            return grads
        if self.sparse_as_dense:
            grads = [self.densify(g) for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        results: list[Any] = [None] * len(grads)
        for group in self._split(present, variables):
            for i, r in zip(group, self.reduce([grads[i] for i in group]), strict=True):
                results[i] = r
        return results

    def _split(self, present: list[int], variables: Sequence[Any] | None) -> list[list[int]]:
        """The indices of the gradients to send, grouped."""
        if not present:
            return []
        if self.groups is None:
            return [present]
        if isinstance(self.groups, int):
            count = min(self.groups, len(present))
            quotient, remainder = divmod(len(present), count)
            bounds = [i * quotient + min(i, remainder) for i in range(count + 1)]
            return [present[bounds[i] : bounds[i + 1]] for i in range(count)]
        if variables is None:
            raise ValueError("hora: groups of variables need the variables the gradients belong to.")
        position = {id(v): i for i, v in enumerate(variables)}
        taken: set[int] = set()
        grouped = []
        for group in self.groups:
            members = [position[id(v)] for v in group if id(v) in position and position[id(v)] in present]
            members = [i for i in members if i not in taken]
            taken.update(members)
            if members:
                grouped.append(members)
        return grouped + [[i] for i in present if i not in taken]
