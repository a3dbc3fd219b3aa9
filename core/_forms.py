"""The request layer: every collective described once, and the one path that makes all its call forms.

A collective is called on one tensor or on a group, in place or on copies,
waiting for the result or returning a handle: up to eight forms
(``allreduce``, ``allreduce_``, ``allreduce_async``, ``grouped_allreduce_``,
...). :func:`call` is every form of every collective; the public functions
of ``hora`` and of each framework adapter are one call to it each, but for
the in-place allreduce and broadcast of one tensor the engine can read as
it is, which try :func:`run_in_place` first (one native call). A framework
supplies only what is its own (:class:`Adapter`): how a tensor
becomes a host buffer the engine reads and writes, how a result becomes a
tensor again, and how an in-place write is made visible (torch's version
counter). Gradient rules stay in the adapters.

Private: use the collectives of ``hora``, ``hora.torch``, ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hora import _native, basics
from hora._arrays import _check_op, _raw, alltoall_rows, check_root
from hora.basics import current_job, waited_name
from hora.handles import Handle, Request, Result, request_names, submit
from hora.process_sets import ProcessSet, set_id

__all__ = [
    "ALLGATHER",
    "ALLREDUCE",
    "ALLTOALL",
    "BROADCAST",
    "REDUCESCATTER",
    "Adapter",
    "Spec",
    "call",
    "check_differentiable",
    "horovod_op",
    "reducescatter_gradient_scale",
    "run_in_place",
]

_Kind = _native.RequestKind
_ReduceOp = _native.ReduceOp
_SUM = _ReduceOp.SUM
_AVERAGE = _ReduceOp.AVERAGE


class Spec:
    """What the request layer needs to know about one collective."""

    __slots__ = ("callers", "has_root", "has_splits", "kind", "min_dims", "name", "reduces", "waited_name",
                 "writes_input")  # fmt: skip

    def __init__(self, kind: _native.RequestKind, name: str, *, writes_input: bool, reduces: bool = False,
                 min_dims: int = 0, has_root: bool = False, has_splits: bool = False) -> None:  # fmt: skip
        self.kind = kind
        self.name = name  # the public name: "allreduce"
        self.writes_input = writes_input  # the result lands in the input, else in memory the engine allocates
        self.reduces = reduces  # takes op and scale factors
        self.min_dims = min_dims
        self.has_root = has_root  # broadcast
        self.has_splits = has_splits  # alltoall
        self.waited_name = waited_name(kind)  # the automatic name of a request its thread waits for at once
        # (grouped, in place) -> the form's name, as messages quote it: "grouped_allreduce_"
        self.callers = {
            (grouped, in_place): f"{'grouped_' if grouped else ''}{name}{'_' if in_place else ''}"
            for grouped in (False, True)
            for in_place in (False, True)
        }


ALLREDUCE = Spec(_Kind.ALLREDUCE, "allreduce", writes_input=True, reduces=True)
ALLGATHER = Spec(_Kind.ALLGATHER, "allgather", writes_input=False, min_dims=1)
BROADCAST = Spec(_Kind.BROADCAST, "broadcast", writes_input=True, has_root=True)
ALLTOALL = Spec(_Kind.ALLTOALL, "alltoall", writes_input=False, min_dims=1, has_splits=True)
REDUCESCATTER = Spec(_Kind.REDUCESCATTER, "reducescatter", writes_input=False, reduces=True, min_dims=1)


class Staged(Protocol):
    """A call's tensors as the engine sees them (see :meth:`Adapter.stage`)."""

    hosts: list[Any]  # the buffers the engine reads (and, for in-place forms and copies, writes)

    def written(self) -> list[Any]:
        """After the engine wrote the hosts: the call's outputs (the inputs themselves, for in-place forms)."""
        ...


class Adapter(Protocol):
    """What a framework supplies to the request layer."""

    def check(self, tensor: object, caller: str, min_dims: int) -> Any:
        """``tensor``, checked (type, dtype, dimensions); raises with a message that quotes it."""
        ...

    def sequence(self, tensors: object, caller: str) -> list[object]:
        """The tensors of a grouped call; raises TypeError when ``tensors`` is not a list of them."""
        ...

    def stage(self, tensors: list[Any], caller: str, *, in_place: bool, writes: bool) -> Staged:
        """The host buffers for ``tensors``: themselves where possible, else copies.

        ``writes``: the engine writes the result into them (in-place forms,
        and the copies an out-of-place allreduce or broadcast reduces into).
        """
        ...

    def request(self, host: Any, caller: str, kind: _native.RequestKind, name: str, process_set: int,
                op: _native.ReduceOp, prescale: float, postscale: float, root: int,
                splits: Sequence[int]) -> Request:  # fmt: skip
        """The engine request for one host buffer."""
        ...

    def output(self, result: Result, like: Any) -> Any:
        """An engine-allocated result (allgather, alltoall, reducescatter) as a tensor like ``like``."""
        ...

    def alltoall_output(self, output: Any, result: Result, splits_given: bool) -> Any:
        """What an alltoall returns, given its output tensor."""
        ...

    def splits(self, splits: object) -> object:
        """Alltoall splits as a sequence of ints (or None)."""
        ...


def call(
    spec: Spec,
    given: object,
    *,
    adapter: Adapter,
    grouped: bool,
    in_place: bool,
    wait: bool,
    name: str | None,
    process_set: ProcessSet,
    op: object = _SUM,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    root_rank: object = None,
    splits: object = None,
    outputs: Sequence[Any] | None = None,
) -> Any:
    """Every form of every collective: one tensor or a group, in place or on copies, waiting or not.

    Checks the tensors, names the requests, submits them in one call into
    the engine (as a group when ``grouped``) and returns the handle, or with
    ``wait`` the result: the input tensors for in-place forms, new tensors
    otherwise (for an alltoall, what the adapter makes of its output).

    ``outputs``, one host buffer per tensor, take an allreduce's results
    instead (the crossings of ``hora.tensorflow`` and ``hora.jax`` pass
    buffers of their own): the tensors are then only read, where they lie,
    and the result is the outputs.
    """
    # Every line here runs for every collective a training step submits: keep it lean (bench/peers.py's small sizes).
    caller = spec.callers[grouped, in_place]
    if grouped:
        tensors = [adapter.check(t, caller, spec.min_dims) for t in adapter.sequence(given, caller)]
    else:
        tensors = [adapter.check(given, caller, spec.min_dims)]
    reduce_op, prescale, postscale = _SUM, 1.0, 1.0
    if spec.reduces:
        reduce_op = _check_op(op, spec.callers[grouped, False])
        prescale, postscale = float(prescale_factor), float(postscale_factor)
    job = current_job()
    ps = set_id(process_set, caller)
    root = check_root(root_rank, job.size, caller) if spec.has_root else -1
    send_rows: list[int] = []
    if spec.has_splits:
        members = len(job.engine.process_set(ps))
        send_rows = alltoall_rows(tensors[0].shape[0], adapter.splits(splits), members)
    reads_only = outputs is not None
    if reads_only and (spec.kind != _Kind.ALLREDUCE or len(outputs) != len(tensors)):
        raise ValueError(
            f"hora.{caller}: outputs are for an allreduce, one per tensor; got {len(outputs)} for {len(tensors)} "
            f"tensors of a {spec.name}."
        )
    staged = adapter.stage(
        tensors, caller, in_place=in_place and not reads_only, writes=spec.writes_input and not reads_only
    )
    group, names = request_names(job, spec.kind, name, ps, len(tensors), wait)
    kind, request, hosts = spec.kind, adapter.request, staged.hosts
    if grouped:
        requests = [
            request(host, caller, kind, names[i], ps, reduce_op, prescale, postscale, root, send_rows)
            for i, host in enumerate(hosts)
        ]
    else:  # a comprehension's own frame costs more than the rest of this line
        requests = [request(hosts[0], caller, kind, names[0], ps, reduce_op, prescale, postscale, root, send_rows)]
    finish: Callable[[list[Result]], Any]
    if reads_only:
        for engine_request, output in zip(requests, outputs, strict=True):
            engine_request.output = _raw(output)  # numpy host buffers, bfloat16 as its bits
        finish = (lambda results: list(outputs)) if grouped else (lambda results: outputs[0])
    elif spec.writes_input:
        finish = (lambda results: staged.written()) if grouped else (lambda results: staged.written()[0])
    elif spec.has_splits:
        finish = lambda results: adapter.alltoall_output(  # noqa: E731
            adapter.output(results[0], tensors[0]), results[0], splits is not None
        )
    elif grouped:
        finish = lambda results: [adapter.output(r, t) for r, t in zip(results, tensors, strict=True)]  # noqa: E731
    else:
        finish = lambda results: adapter.output(results[0], tensors[0])  # noqa: E731
    return submit(job, requests, finish, group=group, wait=wait)


def run_in_place(
    spec: Spec,
    host: object,
    name: object,
    process_set: object,
    op: object = _SUM,
    prescale_factor: object = 1.0,
    postscale_factor: object = 1.0,
    root_rank: object = -1,
    *,
    wait: bool = True,
) -> bool | Handle:
    """The in-place form of an allreduce or broadcast on one host buffer, in one native call, if it can.

    The fast path of :func:`call` for the collectives a script calls one
    small tensor at a time. Such a call costs the engine about what it costs
    MPI, and :func:`call`'s checks and objects as much again; where ranks
    outnumber cores that CPU time is what the call takes (docs/performance.md).
    It takes the arguments in the types the public functions document (a
    ReduceOp; float, int or bool factors; a registered ProcessSet; a name or
    None; a root :func:`check_root` accepts), converted as :func:`call`
    converts them, and ``host`` when the engine reads it as it is (a
    writable C-contiguous buffer whose format names a type it reduces).
    With ``wait`` (the blocking form) it runs the collective and returns
    True; without, it submits it and returns its :class:`Handle`, whose
    result is ``host``, but only for a named request: an automatic name
    counts calls, and a rank that declined after taking one would name its
    next request differently from the others. Returns False, having done
    nothing, for anything else: the caller then runs :func:`call`, which
    converts the rest (a numpy scalar factor, say) and raises, with its
    messages, for what it may not take.
    """
    # Every step here counts: where ranks outnumber cores, each costs several times what it costs alone.
    job = basics._job  # current_job() without its call; None before init, which call reports
    if job is None or type(op) is not _ReduceOp or not isinstance(process_set, ProcessSet):
        return False
    ps = process_set.process_set_id
    if ps is None or not isinstance(prescale_factor, (float, int)) or not isinstance(postscale_factor, (float, int)):
        return False
    if spec.has_root:
        try:
            root_rank = check_root(root_rank, job.size, spec.name)
        except ValueError:
            return False  # call raises it, after the checks it makes first
    if name is None and wait:
        name = spec.waited_name  # job.unnamed(spec.kind, ps, True)
    elif not isinstance(name, str) or not name:
        return False
    pre = prescale_factor if type(prescale_factor) is float else float(prescale_factor)
    post = postscale_factor if type(postscale_factor) is float else float(postscale_factor)
    engine = job.engine
    if wait:
        return engine.try_run_in_place(spec.kind, name, host, op, pre, post, root_rank, ps)
    handle = engine.try_submit_in_place(spec.kind, name, host, op, pre, post, root_rank, ps)
    return Handle(engine, [handle], lambda results: host, name) if handle >= 0 else False


# --- conventions every framework adapter shares (Horovod's) ----------------------------------------


def horovod_op(op: object, average: bool | None, caller: str) -> _native.ReduceOp:
    """Horovod's ``op``/``average`` pair as one op (``average`` is Horovod's older spelling; default Average).

    ``caller`` names the function in messages, with its module: ``"torch.allreduce"``.
    """
    if op is not None and average is not None:
        raise ValueError(f"hora.{caller}: pass op or the older average, not both (got op={op}, average={average}).")
    if op is None:
        op = _AVERAGE if average is None or average else _SUM
    return _check_op(op, caller)


def check_differentiable(op: _native.ReduceOp, caller: str) -> None:
    """Raises when a reduction with ``op`` has no gradient: only Sum and Average have one."""
    if op not in (_SUM, _AVERAGE):
        raise RuntimeError(f"hora.{caller} has no gradient for op {op}; only Sum and Average are differentiable.")


def reducescatter_gradient_scale(op: _native.ReduceOp, prescale: float, postscale: float, members: int) -> float:
    """What a reducescatter's output gradient is multiplied by before it is gathered (Horovod's convention).

    Horovod scales it as allreduce's gradient: every rank's gradient counts,
    so Sum multiplies by the set size and Average does not divide (the adjoint
    alone would give Sum ``1`` and Average ``1/size`` per element where
    Horovod gives ``size`` and ``1``). The scale factors multiply, as in the
    forward pass.
    """
    return (members if op == _SUM else 1) * prescale * postscale
