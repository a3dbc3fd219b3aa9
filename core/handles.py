"""Handles of operations in flight, and the one path by which operations reach the engine.

Every collective is submitted through :func:`submit`: it names the request
(the same name on every rank when the call sequence is the same), hands it to
the native engine and returns a :class:`Handle` at once. ``poll`` asks whether
it finished, ``synchronize`` waits for it and returns its result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hora import _native
from hora.basics import _Job

__all__ = ["Handle", "poll", "synchronize"]


class Request(NamedTuple):
    """One tensor's part of a request, as ``Engine.submit`` takes it (positionally, for speed)."""

    buffer: Any = None
    dtype: _native.DataType = _native.DataType.FLOAT32
    op: _native.ReduceOp = _native.ReduceOp.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    shape: Sequence[int] = ()
    splits: Sequence[int] = ()
    ranks: Sequence[int] = ()


# A raw engine result: (output bytes or None, shape, received splits, value).
RawResult = tuple[Any, list[int], list[int], int]


class Handle:
    """An operation in flight. Pass it to :func:`hora.poll` or :func:`hora.synchronize`.

    A handle may stand for several engine requests (a grouped call); it
    completes when all of them have.
    """

    __slots__ = ("_engine", "_error", "_finish", "_ids", "_raw", "_value", "_waited", "name")

    def __init__(
        self,
        engine: _native.Engine,
        ids: Sequence[int],
        finish: Callable[[list[RawResult]], Any],
        name: str,
    ) -> None:
        self._engine = engine
        self._ids = tuple(ids)
        self._finish: Callable[[list[RawResult]], Any] | None = finish
        self._raw: list[RawResult] = []  # results of the first len(_raw) requests, collected so far
        self._waited = False
        self._value: Any = None
        self._error: BaseException | None = None
        self.name = name

    def __repr__(self) -> str:
        state = "done" if self._waited else "in flight"
        return f"<hora.Handle {self.name!r} ({state})>"

    def __del__(self) -> None:
        # A handle dropped without synchronize (fire-and-forget, or an exception between submit and
        # synchronize): the engine finishes the requests, whose buffers it owns, and forgets their results.
        if self._waited:
            return
        try:
            for request in self._ids[len(self._raw) :]:
                self._engine.release(request)
        except Exception:  # the engine may be gone already (interpreter exit)
            pass

    def done(self) -> bool:
        """Whether the operation has finished (successfully or not); never blocks."""
        return self._waited or all(self._engine.poll(i) for i in self._ids[len(self._raw) :])

    def wait(self) -> Any:
        """Blocks until the operation finishes; returns its result or raises its error.

        A KeyboardInterrupt while waiting leaves the handle usable: wait again
        to pick up where it stopped.
        """
        if not self._waited:
            for request in self._ids[len(self._raw) :]:
                try:
                    result = self._engine.wait(request)
                except Exception as error:  # wait for the rest, then raise the first failure
                    if self._error is None:
                        self._error = error
                    result = (None, [], [], -1)
                self._raw.append(result)
            self._waited = True
            if self._error is None and self._finish is not None:
                self._value = self._finish(self._raw)
            self._finish = None
            self._raw = []
        if self._error is not None:
            raise self._error
        return self._value


def poll(handle: Handle) -> bool:
    """Returns True when the operation of ``handle`` has finished; never blocks."""
    return _check(handle, "poll").done()


def synchronize(handle: Handle) -> Any:
    """Waits for the operation of ``handle`` and returns its result (raises its error).

    Calling it again returns the same result.
    """
    return _check(handle, "synchronize").wait()


def _check(handle: object, caller: str) -> Handle:
    if not isinstance(handle, Handle):
        raise TypeError(f"hora.{caller} expects a handle returned by an *_async operation, got {handle!r}.")
    return handle


def submit(
    job: _Job,
    kind: _native.RequestKind,
    requests: Sequence[Request],
    finish: Callable[[list[RawResult]], Any],
    *,
    name: str | None,
    process_set: int,
    wait: bool = False,
) -> Any:
    """Submits one request, or several as one group, and returns their handle; with ``wait``, their result.

    Each entry of ``requests`` describes one tensor; the tensors of a group
    are ``<name>.<i>``. Unnamed requests get automatic names (see
    ``_Job.unnamed``). With ``wait``, a single request goes through :func:`run`.
    """
    if wait and len(requests) == 1:
        return finish([run(job, kind, requests[0], name=name, process_set=process_set)])
    base = _request_name(job, kind, name, process_set, wait)
    engine = job.engine
    if len(requests) == 1:
        r = requests[0]
        ids = [
            engine.submit(
                kind, base, r.buffer, r.dtype, r.op, r.prescale, r.postscale, r.root, process_set, r.shape, r.splits,
                "", 0, r.ranks,
            )
        ]  # fmt: skip
    else:  # a group is queued whole or not at all
        names = [f"{base}.{i}" for i in range(len(requests))]
        ids = engine.submit_group(kind, base, process_set, names, list(requests))
    handle = Handle(engine, ids, finish, base)
    return handle.wait() if wait else handle


def run(job: _Job, kind: _native.RequestKind, request: Request, *, name: str | None, process_set: int) -> RawResult:
    """Runs one request to completion and returns its raw result: ``submit(..., wait=True)`` for one tensor.

    One native call submits the request and drives the engine on this thread
    until it completes, so a synchronous collective crosses no thread.
    """
    base = _request_name(job, kind, name, process_set, True)
    r = request
    return job.engine.run(
        kind, base, r.buffer, r.dtype, r.op, r.prescale, r.postscale, r.root, process_set, r.shape, r.splits, r.ranks
    )


def _request_name(job: _Job, kind: _native.RequestKind, name: str | None, process_set: int, waited: bool) -> str:
    """``name``, checked, or the automatic name (see ``_Job.unnamed``)."""
    if name is None:
        return job.unnamed(kind, process_set, waited)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}.")
    return name
