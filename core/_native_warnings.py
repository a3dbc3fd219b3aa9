"""The native core's warnings, in Python's logging (the ``hora`` logger).

The engine's and the transports' threads never take the GIL (they hold
locks that Python threads wait for), so the core queues its warnings (a
stall, a rejected connection, shared memory falling back to TCP) while this
process is in a job. ``hora.init()`` logs those of the connection set-up
itself, before it returns (so they come in order with the caller's own
output), then starts a daemon thread that waits for later ones without the
GIL and logs each as a warning of the ``hora`` logger. With logging
unconfigured, Python prints warnings to stderr, as before. Outside a job the
core writes them to stderr itself.
"""

from __future__ import annotations

import logging
import threading

from hora import _native

__all__ = ["pump", "queue", "stop"]

_logger = logging.getLogger("hora")
_lock = threading.Lock()
_queued = False
_pump: tuple[threading.Thread, threading.Event] | None = None


def queue() -> None:
    """From now on the core queues its warnings (until :func:`stop`)."""
    global _queued
    with _lock:
        if not _queued:
            _native.set_warnings_drained(True)
            _queued = True


def pump() -> None:
    """Logs the warnings queued so far on this thread, then keeps logging later ones on a daemon thread."""
    global _pump
    with _lock:
        if not _queued or _pump is not None:
            return
        _log(_native.take_warnings(0.0))
        stopping = threading.Event()  # each pump its own: a late one from before never revives
        thread = threading.Thread(target=_drain, args=(stopping,), name="hora-warnings", daemon=True)
        thread.start()
        _pump = (thread, stopping)


def stop() -> None:
    """Logs what is still queued and hands the core's warnings back to stderr."""
    global _pump, _queued
    with _lock:
        if _pump is not None:
            (thread, stopping), _pump = _pump, None
            stopping.set()
            thread.join(timeout=2.0)
        if _queued:
            _log(_native.take_warnings(0.0))
            _native.set_warnings_drained(False)  # anything since goes to stderr: nothing is lost in between
            _queued = False


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
