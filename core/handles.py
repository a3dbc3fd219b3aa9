"""Handles of operations in flight, and the one path by which operations reach the engine.

Every collective is submitted through :func:`submit` (but for the one-call
path of ``hora._forms.run_in_place``): it names the request (the same name on
every rank when the call sequence is the same), hands it to the native engine
and returns a :class:`Handle` at once. ``poll`` asks whether
it finished, ``synchronize`` waits for it and returns its result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hora import _native
from hora.basics import _Job

__all__ = ["Handle", "poll", "synchronize"]

Request = _native.Request
Result = _native.Result


class Handle:
    """An operation in flight. Pass it to :func:`hora.poll` or :func:`hora.synchronize`.

    A handle may stand for several engine requests (a grouped call); it
    completes when all of them have.
    """

    __slots__ = ("_engine", "_error", "_finish", "_ids", "_value", "_waited", "name")

    def __init__(
        self,
        engine: _native.Engine,
        ids: list[int],
        finish: Callable[[list[Result]], Any],
        name: str,
    ) -> None:
        self._engine = engine
        self._ids = ids
        self._finish: Callable[[list[Result]], Any] | None = finish
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
            for request in self._ids:
                self._engine.release(request)
        except Exception:  # the engine may be gone already (interpreter exit)
            pass

    def done(self) -> bool:
        """Whether the operation has finished (successfully or not); never blocks."""
        return self._waited or all(self._engine.poll(i) for i in self._ids)

    def wait(self) -> Any:
        """Blocks until the operation finishes; returns its result or raises its error.

        A KeyboardInterrupt while waiting leaves the handle usable: wait again
        to pick up where it stopped.
        """
        if not self._waited:
            try:
                results = self._engine.wait(self._ids)  # an interrupt leaves every request in flight
            except Exception as error:
                self._error = error
            else:
                if self._finish is not None:
                    self._value = self._finish(results)
            self._waited = True
            self._finish = None
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


def request_names(
    job: _Job, kind: _native.RequestKind, name: str | None, process_set: int, count: int, wait: bool
) -> tuple[str, list[str]]:
    """The names of the requests of one call: its group name ("" for one tensor) and one name per tensor.

    The call's name is ``name``, checked, or the automatic name (see
    ``_Job.unnamed``), which depends on whether the call waits. One tensor
    takes that name; several form the group of that name, ``<name>.<i>``.
    """
    if name is None:
        base = job.unnamed(kind, process_set, wait)
    elif isinstance(name, str) and name:
        base = name
    else:
        raise ValueError(f"name must be a non-empty string, got {name!r}.")
    return ("", [base]) if count == 1 else (base, [f"{base}.{i}" for i in range(count)])


def submit(job: _Job, requests: list[Request], finish: Callable[[list[Result]], Any], *, group: str,
           wait: bool = False) -> Any:  # fmt: skip
    """Submits one request, or several as the group ``group``, and returns their handle; with ``wait``, their result.

    The requests are named by :func:`request_names`. ``finish`` turns the
    engine's results into the call's value. With ``wait``, the requests run
    in one native call that submits them and drives the engine on this
    thread until they complete, so a synchronous collective crosses no thread
    (an interrupted one leaves its requests to complete without it).
    """
    engine = job.engine
    if wait:
        return finish([engine.run(requests[0])] if len(requests) == 1 else engine.run_all(requests, group))
    return Handle(engine, engine.submit(requests, group), finish, group or requests[0].name)
