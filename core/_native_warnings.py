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
_thread: threading.Thread | None = None
_stopping = threading.Event()


def start() -> None:
    """Starts logging the core's warnings (idempotent)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _native.set_warnings_drained(True)
        _stopping.clear()
        _thread = threading.Thread(target=_pump, name="hora-warnings", daemon=True)
        _thread.start()


def stop() -> None:
    """Logs what is still queued and hands the core's warnings back to stderr."""
    global _thread
    with _lock:
        thread, _thread = _thread, None
        if thread is None:
            return
        _stopping.set()
        thread.join(timeout=2.0)
        _log(_native.take_warnings(0.0))
        _native.set_warnings_drained(False)  # anything later goes to stderr; nothing is lost in between


def _pump() -> None:
    while not _stopping.is_set():
        _log(_native.take_warnings(0.2))


def _log(texts: list[str]) -> None:
    for text in texts:
        _logger.warning("%s", text)
