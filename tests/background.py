"""Whole programs that tests run in the background, a few at a time, each test waiting for its own.

Some tests run a complete program (a notebook, an example on Spark) that
spends most of its time waiting: for a JVM, for Python workers importing a
framework, for Ray's fixed start-up sleeps. Two such programs share this
2-core machine with little slowdown, so a module starts its programs
together (``parallel`` at a time, in the order given) and each test collects
the one it checks. Every program runs in a session of its own, and whatever
is left of one that times out or is not collected is killed by its process
group.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Program:
    """One program to run: its command line, working directory, environment and time limit in seconds."""

    argv: Sequence[str]
    cwd: Path
    env: Mapping[str, str]
    timeout: float


@dataclasses.dataclass
class _Run:
    program: Program
    stdout: Path
    stderr: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    timed_out: bool = False


class BackgroundRuns:
    """Runs ``programs`` (name -> Program), ``parallel`` at a time; ``result(name)`` waits for one.

    A program's time limit counts from its start; one past it is killed
    whether or not a test waits for it. Waiting for a program that has not
    started yet starts it at once. Programs still running at ``close()``, or
    when the interpreter exits, are killed.
    """

    def __init__(self, programs: Mapping[str, Program], output: Path, parallel: int = 2) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}.")
        self._parallel = parallel
        self._runs = {
            name: _Run(program, output / f"{name}.stdout", output / f"{name}.stderr")
            for name, program in programs.items()
        }
        atexit.register(self.close)
        try:
            self._step()
        except BaseException:
            self.close()
            raise

    def result(self, name: str) -> subprocess.CompletedProcess[str]:
        """Waits for ``name`` to end, starting the next programs as others end, and returns its outcome.

        Raises ``subprocess.TimeoutExpired`` (with the output so far) when it
        ran past its time limit and was killed.
        """
        run = self._runs[name]
        if run.process is None:
            self._start(run)
        while run.process.poll() is None:
            self._step()
            time.sleep(0.2)
        self._step()
        if run.timed_out:
            raise subprocess.TimeoutExpired(
                list(run.program.argv), run.program.timeout, self._read(run.stdout), self._read(run.stderr)
            )
        return subprocess.CompletedProcess(
            list(run.program.argv), run.process.returncode, self._read(run.stdout), self._read(run.stderr)
        )

    def close(self) -> None:
        """Kills every program still running; those never started are dropped."""
        atexit.unregister(self.close)
        for run in self._runs.values():
            if run.process is not None and run.process.poll() is None:
                with contextlib.suppress(Exception):  # one that cannot be reaped must not keep the rest alive
                    self._kill(run)

    def _step(self) -> None:
        """Kills the programs past their time limit, then starts the next while fewer than ``parallel`` run."""
        running = 0
        for run in self._runs.values():
            if run.process is None or run.process.poll() is not None:
                continue
            if time.monotonic() - run.started > run.program.timeout:
                run.timed_out = True
                self._kill(run)
            else:
                running += 1
        for run in self._runs.values():
            if running >= self._parallel:
                return
            if run.process is None:
                self._start(run)
                running += 1

    @staticmethod
    def _start(run: _Run) -> None:
        with open(run.stdout, "wb") as out, open(run.stderr, "wb") as err:
            run.process = subprocess.Popen(
                run.program.argv, cwd=run.program.cwd, env=dict(run.program.env), stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True,
            )  # fmt: skip
        run.started = time.monotonic()

    @staticmethod
    def _kill(run: _Run) -> None:
        assert run.process is not None
        with contextlib.suppress(ProcessLookupError):  # its session's group: the program and what it started
            os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait(timeout=30)

    @staticmethod
    def _read(path: Path) -> str:
        return path.read_text(errors="replace")
