"""Runs a worker script's cases on every rank and prints one summary line per rank."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable

import hora.torch as hvd
import torch


def run_cases(cases: Callable[[int, int], Iterable[tuple[str, Callable[[], None]]]]) -> int:
    """Runs ``cases(rank, size)``; prints ``rank R: P of T cases passed``; returns the exit code."""
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    only = os.environ.get("HORA_TEST_ONLY")
    failures = total = 0
    for name, case in cases(rank, size):
        if only and only not in name:
            continue
        total += 1
        try:
            case()
        except Exception:
            failures += 1
            print(f"FAILED {name}:\n{traceback.format_exc()}", flush=True)
    print(f"rank {rank}: {total - failures} of {total} cases passed", flush=True)
    return 1 if failures else 0
