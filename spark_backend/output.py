"""Worker output, line by line, from Spark tasks to the driver.

In a task, :class:`LineForwarder` replaces ``sys.stdout``/``sys.stderr``:
every write still goes to the original stream (so it stays in the executor
logs), and every complete line is also sent to the driver service's event
stream. On the driver, :class:`OutputPrinter` prints each arriving line with
its rank, ``[rank]<stdout>:line`` as ``horarun`` does, and keeps the last
lines of every rank for error messages.
"""

from __future__ import annotations

import collections
import io
import sys
import threading
import time
from typing import IO, Any

from hora.driver import EventStream

__all__ = ["LineForwarder", "OutputPrinter"]

TAIL_LINES = 20


class LineForwarder(io.TextIOBase):
    """A text stream that writes through to ``original`` and sends each complete line as an event."""

    def __init__(self, original: IO[str], events: EventStream, index: int, stream: str, echo: bool = True) -> None:
        super().__init__()
        self._original = original
        self._echo = echo  # False where the original stream is the driver's own console (local mode)
        self._events = events
        self._index = index
        self._stream = stream
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._echo:
            self._original.write(text)
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._events.send({"type": "output", "index": self._index, "stream": self._stream, "line": line})
        return len(text)

    def flush(self) -> None:
        self._original.flush()

    def close_line(self, *, within: float | None = None) -> None:
        """Sends what is left of an unfinished last line.

        Args:
            within: None to wait as long as needed; otherwise the most seconds
                to wait for this stream's lock and then the event stream's
                (see :meth:`EventStream.send`), after which the rest is dropped.
        """
        if not self._lock.acquire(timeout=-1 if within is None else max(within, 0.0)):
            return
        try:
            rest, self._pending = self._pending, ""
        finally:
            self._lock.release()
        if rest:
            message = {"type": "output", "index": self._index, "stream": self._stream, "line": rest}
            self._events.send(message, within=within)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8")

    def fileno(self) -> int:
        return self._original.fileno()


class OutputPrinter:
    """Prints the lines of every task as they arrive and remembers each task's last lines."""

    def __init__(self, stdout: IO[str] | None, stderr: IO[str] | None, verbose: int, timestamps: bool = False) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._verbose = verbose
        self._timestamps = timestamps  # Horovod's prefix_output_with_timestamp: "<asctime>[rank]<stdout>:line"
        self._lock = threading.Lock()
        self._tails: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES)
        )

    def line(self, index: int, stream: str, line: str) -> None:
        text = f"{time.asctime() if self._timestamps else ''}[{index}]<{stream}>:{line}"
        with self._lock:
            self._tails[index].append(text)
            if self._verbose <= 0:
                return
            sink = (self._stderr or sys.stderr) if stream == "stderr" else (self._stdout or sys.stdout)
            sink.write(text + "\n")
            sink.flush()

    def tail(self, index: int) -> list[str]:
        with self._lock:
            return list(self._tails.get(index, ()))

    def handle(self, message: dict[str, Any]) -> None:
        if message.get("type") == "output":
            self.line(int(message["index"]), str(message["stream"]), str(message["line"]))
