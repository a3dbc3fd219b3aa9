"""Exceptions raised by Hora.

``HoraError`` and ``HoraInternalError`` are defined by the compiled core and
re-exported here, so a failure inside a collective and a failure in Python
code share one hierarchy::

    HoraError (RuntimeError)
    ├── HoraInternalError      communication with a peer failed
    ├── RequestError           (also a ValueError) the ranks' requests for a collective disagree
    ├── NotInitializedError    a job-scoped call before hora.init()
    ├── RendezvousError        workers could not be brought together
    ├── RemovedFromJobError    an elastic job goes on without this worker
    └── AuthenticationError    a message failed its signature check

    HostsUpdatedInterrupt (RuntimeError)   an elastic job's hosts changed: re-form at this commit
"""

from __future__ import annotations

from hora._native import HoraError, HoraInternalError, RequestError

__all__ = [
    "AuthenticationError",
    "HoraError",
    "HoraInternalError",
    "HostsUpdatedInterrupt",
    "NotInitializedError",
    "RemovedFromJobError",
    "RendezvousError",
    "RequestError",
]


class NotInitializedError(HoraError):
    """Raised when a function that needs a running job is called before ``hora.init()``."""


class RendezvousError(HoraError):
    """Raised when the workers of a job cannot be brought together (timeout, bad registration)."""


class AuthenticationError(HoraError):
    """Raised when a driver message is unsigned, tampered with or replayed."""


class RemovedFromJobError(HoraError):
    """Raised by ``hora.init()`` in a worker that its elastic job goes on without.

    Its host was removed by host discovery or blacklisted, or the job already
    has ``--max-np`` workers. :func:`hora.elastic.run` ends such a worker's
    process with exit code 0.
    """


class HostsUpdatedInterrupt(RuntimeError):  # noqa: N818 - Horovod's name
    """Raised by ``state.commit()`` on every rank at once when the elastic job's hosts changed.

    :func:`hora.elastic.run` catches it and re-forms the job without
    restoring the committed state (it was just committed). As in Horovod.

    Args:
        skip_sync: hosts were only removed, so every remaining worker already
            holds the committed state and the state need not be synced.
    """

    def __init__(self, skip_sync: bool) -> None:
        super().__init__(f"The elastic job's hosts changed (skip_sync={skip_sync}).")
        self.skip_sync = skip_sync
