"""Runs a worker script's cases on every rank and prints one summary line per rank."""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterable, Iterator

import hora

Cases = Callable[[int, int], Iterable[tuple[str, Callable[[], None]]]]


def run_cases(cases: Cases, before: Callable[[int], None] | None = None) -> int:
    """Initialises Hora, runs ``cases(rank, size)`` and returns the exit code.

    Prints ``FAILED <case>`` with the traceback of each failure and, last,
    ``rank R: P of T cases passed``. ``before(rank)`` runs after ``init``.
    ``HORA_TEST_ONLY=text`` runs only the cases whose name holds ``text``.
    """
    hora.init()
    rank, size = hora.rank(), hora.size()
    if before is not None:
        before(rank)
    return run_each(cases(rank, size), f"rank {rank}")


def run_each(cases: Iterable[tuple[str, Callable[[], None]]], label: str) -> int:
    """Runs each named case; prints ``FAILED <case>`` with the traceback of each failure and, last,
    ``<label>: P of T cases passed``; returns the exit code. ``HORA_TEST_ONLY=text`` runs only the cases
    whose name holds ``text``."""
    only = os.environ.get("HORA_TEST_ONLY")
    failures = total = 0
    for name, case in cases:
        if only and only not in name:
            continue
        total += 1
        try:
            case()
        except Exception:
            failures += 1
            print(f"FAILED {name}:\n{traceback.format_exc()}", flush=True)
    print(f"{label}: {total - failures} of {total} cases passed", flush=True)
    return 1 if failures else 0


@contextlib.contextmanager
def checked_calls() -> Iterator[list[str]]:
    """Within the block, the names of the collectives that take the request layer's checked path.

    That is ``hora._forms.call``; the one-call path (``hora._forms.run_in_place``) does not go through it.
    """
    from hora import _forms

    names: list[str] = []
    call = _forms.call

    def counted(spec: _forms.Spec, given: object, **form: object) -> object:
        names.append(spec.name)
        return call(spec, given, **form)

    _forms.call = counted
    try:
        yield names
    finally:
        _forms.call = call
