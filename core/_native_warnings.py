"""The native core's warnings, in Python's logging (the ``hora`` logger).

The engine's and the transports' threads never take the GIL (they hold
locks that Python threads wait for), so the core queues its warnings (a
stall, a rejected connection, shared memory falling back to TCP). While
this process is in a job, a daemon thread started by ``hora.init()`` waits
for them without the GIL and logs each as a warning of the ``hora``
logger; with logging unconfigured, Python prints warnings to stderr, as
before. Outside a job the core writes them to stderr itself.
"""

from __future__ import annotations

import logging
import threading

from hora import _native

__all__ = ["start", "stop"]

_logger = logging.getLogger("hora")
_lock = threading.Lock()
_pump: tuple[threading.Thread, threading.Event] | None = None


def start() -> None:
    """Starts logging the core's warnings (idempotent)."""
    global _pump
    with _lock:
        if _pump is not None:
            return
        stopping = threading.Event()  # each pump its own: a late one from before never revives
        thread = threading.Thread(target=_drain, args=(stopping,), name="hora-warnings", daemon=True)
        _native.set_warnings_drained(True)
        thread.start()
        _pump = (thread, stopping)


def stop() -> None:
    """Logs what is still queued and hands the core's warnings back to stderr."""
    global _pump
    with _lock:
        if _pump is None:
            return
        (thread, stopping), _pump = _pump, None
        stopping.set()
        thread.join(timeout=2.0)
        _log(_native.take_warnings(0.0))
        _native.set_warnings_drained(False)  # anything since goes to stderr: nothing is lost in between


def _drain(stopping: threading.Event) -> None:
    try:
        while not stopping.is_set():
            _log(_native.take_warnings(0.2))
    except BaseException:  # a broken handler must not leave warnings queued with nobody to read them
        _native.set_warnings_drained(False)
        raise


def _log(texts: list[str]) -> None:
    for text in texts:
        _logger.warning("%s", text)
