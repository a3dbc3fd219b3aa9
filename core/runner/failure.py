"""Which worker to blame when a job fails, and the sentence that says so.

The first worker to exit with an error is rarely the cause. When rank 1
stops (SIGSTOP, a debugger) or dies, its peers fail a moment later, each
naming the neighbour it was waiting on, and the first of them to exit is
an innocent bystander. So when the first worker fails, the launcher watches
the others for a short grace period and then blames, in this order:

1. a worker with a stopped process (state T or t in ``/proc``): it neither
   runs nor exits, so only its state shows it;
2. the first worker killed by a signal: a crash, an OOM kill, a ``kill -9``;
3. the first worker that exited with an error.

A worker that exits, with any code, before it registered with the driver
service while others wait for it in rendezvous is different: the job can
never start, the worker is the culprit by itself, and the launcher says so
at once (:func:`exited_unregistered`) instead of waiting for the start timeout.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from hora.runner.proc_state import stopped_process
from hora.runner.worker import Worker

__all__ = ["Diagnosis", "diagnose", "exited_unregistered", "how_it_ended", "shell_code"]


@dataclass(frozen=True)
class Diagnosis:
    """The failure to report: the culprit, what happened to it, and the launcher's exit code."""

    culprit: Worker
    what: str
    exit_code: int


def how_it_ended(code: int) -> str:
    """``exited with code 3`` or ``was killed by signal 9 (SIGKILL)``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


def shell_code(code: int) -> int:
    """A worker's exit code as the launcher's own: 128 + N for death by signal N, as shells report it."""
    return code if code >= 0 else 128 - code


def diagnose(workers: Sequence[Worker], first: Worker) -> Diagnosis:
    """Chooses the worker to blame once ``first`` (the first to fail) and its peers had their grace period."""
    assert first.exit_code is not None
    for worker in workers:
        if worker.exit_code is not None:
            continue
        stopped = stopped_process(worker.process.pid)
        if stopped is not None:
            pid, state = stopped
            why = "a debugger holds it" if state == "t" else "it got SIGSTOP or SIGTSTP"
            return Diagnosis(
                worker,
                f"is stopped (its process {pid} is in state {state}: {why}), so its peers could not go on",
                shell_code(first.exit_code),
            )
    ended = sorted((w for w in workers if w.exit_code is not None), key=lambda w: w.exited_at or 0.0)
    for worker in ended:
        assert worker.exit_code is not None
        if worker.exit_code < 0:
            return Diagnosis(worker, how_it_ended(worker.exit_code), shell_code(worker.exit_code))
    return Diagnosis(first, how_it_ended(first.exit_code), shell_code(first.exit_code))


def exited_unregistered(worker: Worker) -> Diagnosis:
    """The failure of a job whose ``worker`` exited before registering, while other workers wait for it.

    The launcher exits with the worker's own code, or 1 if it exited 0: the job failed all the same.
    """
    assert worker.exit_code is not None
    return Diagnosis(
        worker,
        f"(slot {worker.slot} on {worker.host}) {how_it_ended(worker.exit_code)} before it registered with the "
        "driver service, while other workers wait for it in hora.init(); the job cannot start. Every worker "
        "must call hora.init() (hvd.init()), as many times as the others",
        shell_code(worker.exit_code) or 1,
    )
