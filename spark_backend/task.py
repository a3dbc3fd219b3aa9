"""One Spark task as a Hora worker: its environment, its output stream to the driver, and undoing both.

Spark reuses Python workers for later tasks, so whatever a task changes in
its process (the ``HORA_*`` variables, the job secret among them; ``sys.stdout``
and ``sys.stderr``) is undone when it ends, whatever failed. Used by
:func:`hora.spark.run` (barrier tasks) and :func:`hora.spark.run_elastic`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from hora.driver import EventStream
from hora.driver.contract import WorkerEnv
from hora.spark.output import LineForwarder

__all__ = ["TaskSession", "task_session"]


@dataclass(frozen=True)
class TaskSession:
    """What a task holds while it runs: its event stream to the driver and the forwarders of its output."""

    events: EventStream
    forwarders: tuple[LineForwarder, LineForwarder]


@contextlib.contextmanager
def task_session(contract: WorkerEnv, user_env: dict[str, str]) -> Iterator[TaskSession]:
    """Sets the task up as worker ``contract.index``; on exit shuts Hora down and restores the process.

    Args:
        contract: this task's part of the job contract (it carries the driver's address and the secret).
        user_env: the caller's variables for the task.
    """
    import hora

    assert contract.driver is not None and contract.secret is not None
    env = {**user_env, **contract.to_env()}
    events = EventStream(contract.driver, contract.secret, timeout=30.0)
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    streams = (sys.stdout, sys.stderr)
    # In local mode the executors' output is the driver's console, where the forwarded lines appear already.
    echo = contract.bind != "127.0.0.1"
    forwarders = (
        LineForwarder(streams[0], events, contract.index, "stdout", echo),
        LineForwarder(streams[1], events, contract.index, "stderr", echo),
    )
    sys.stdout, sys.stderr = forwarders
    try:
        yield TaskSession(events, forwarders)
    finally:
        try:
            for forwarder in forwarders:
                forwarder.close_line()
            sys.stdout, sys.stderr = streams
            hora.shutdown()  # stops the other ranks' collectives if this one failed
            events.close()
        finally:  # the secret must not stay in a Python worker that Spark reuses, whatever failed above
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
