"""The elastic training loop: run, and on a failure or a host change re-form the job and go on."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

from hora import basics
from hora.elastic.state import State
from hora.exceptions import HoraInternalError, HostsUpdatedInterrupt, RemovedFromJobError

__all__ = ["lost_peer", "run", "run_fn"]

_log = logging.getLogger("hora.elastic")
R = TypeVar("R")


# How a HoraInternalError reads inside the error a framework raises for a failed host callback: TensorFlow's
# tf.numpy_function (UnknownError) and JAX's buffer_callback (JaxRuntimeError) quote the original's traceback, whose
# last line is "hora._native.HoraInternalError: ..." (TensorFlow) or "HoraInternalError: ..." (JAX).
_WRAPPED = re.compile(rf"(?m)(?:^|\.){HoraInternalError.__name__}: (.+)$")


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` means a peer of the job was lost: a HoraInternalError, or one a framework wrapped.

    Inside ``model.fit``'s compiled step (TensorFlow) or ``jit`` (JAX) the
    engine's error reaches the caller as the framework's own runtime error,
    which carries the original's type and message.
    """
    return isinstance(error, HoraInternalError) or _WRAPPED.search(str(error)) is not None


def _what_failed(error: BaseException) -> str:
    """The engine's own message: a framework's error wraps it in a traceback and more."""
    found = None if isinstance(error, HoraInternalError) else _WRAPPED.search(str(error))
    return str(error) if found is None else found.group(1)


def run_fn(func: Callable[..., R], reset: Callable[[], None]) -> Callable[..., R]:
    """Wraps a training function so that it survives failures and host changes, given how to re-form the job.

    Frameworks whose re-forming needs more than :func:`hora.shutdown` then
    :func:`hora.init` pass their own ``reset``; :func:`run` is this with the
    plain one.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            except Exception as exc:
                if not lost_peer(exc):
                    raise
                _log.warning("A collective failed (%s); restoring the last commit and re-forming the job.",
                             _what_failed(exc))  # fmt: skip
                state.restore()
                skip_sync = False
            try:
                reset()
            except RemovedFromJobError as exc:
                _log.info("%s", exc)
                raise SystemExit(0) from None
            job = basics._job
            if job is not None and job.fresh_members:  # a worker joined as the others re-formed: it needs the state
                skip_sync = False
            state.on_reset()

    return wrapper


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorates an elastic training function ``func(state, *args, **kwargs)``, as Horovod's ``elastic.run``.

    The wrapper syncs ``state`` from rank 0, then calls ``func``. When a
    collective fails (a worker died: :class:`~hora.HoraInternalError`, also
    when TensorFlow or JAX raised it from a compiled step), the
    state goes back to its last commit; when ``state.commit()`` finds that
    hosts were added or removed (:class:`~hora.exceptions.HostsUpdatedInterrupt`)
    it stays as committed. Either way the job re-forms (:func:`hora.shutdown`,
    :func:`hora.init`: a new rendezvous round, perhaps with other workers and
    ranks, and the process sets given to ``init`` registered again), the
    state's reset callbacks run, the state is synced from the
    new rank 0 (unless hosts were only removed) and ``func`` runs again.
    Sets added later with :func:`hora.add_process_set` are gone after a
    reset (as in Horovod): add them again in a reset callback.

    A worker the re-formed job goes on without (its host was removed or
    blacklisted) ends its process with exit code 0.
    """
    return run_fn(func, _reset)


def _reset() -> None:
    job = basics._job
    process_sets = job.init_process_sets if job is not None else ()
    basics.shutdown()
    # A worker that joins at this reset registers the same sets in its own first init(), in the same order.
    basics.init(process_sets=process_sets)
