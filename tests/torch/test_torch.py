"""hora.torch between real processes: every collective and dtype, gradients, DistributedOptimizer, state.

Each worker script runs its cases on every rank and prints ``rank R: P of T
cases passed``; a test passes when every rank reports every case passed.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from tests.conftest import horarun

# (script, ranks, extra horarun arguments, the fewest cases a rank must run)
RUNS = {
    "ops-2-shm": ("tests.torch.op_cases", 2, (), 240),
    "ops-3-shm": ("tests.torch.op_cases", 3, (), 240),
    "ops-2-tcp": ("tests.torch.op_cases", 2, ("--transport", "tcp"), 240),
    "autograd-2": ("tests.torch.autograd_cases", 2, (), 9),
    "autograd-3": ("tests.torch.autograd_cases", 3, (), 9),
    "training-2": ("tests.torch.training_cases", 2, (), 18),
    "training-3": ("tests.torch.training_cases", 3, (), 18),
}


def run_worker(script: str, ranks: int, arguments: tuple[str, ...], at_least: int) -> None:
    result = horarun("-np", str(ranks), *arguments, sys.executable, "-m", script, timeout=230)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summaries = re.findall(r"\[(\d+)\]<stdout>:rank \1: (\d+) of (\d+) cases passed", result.stdout)
    assert sorted(int(r) for r, _, _ in summaries) == list(range(ranks)), result.stdout[-3000:]
    assert all(passed == total and int(total) >= at_least for _, passed, total in summaries), summaries


@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", list(RUNS))
def test_worker_cases(run: str) -> None:
    run_worker(*RUNS[run])


@pytest.mark.timeout(240)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_staged_through_host_memory() -> None:
    run_worker("tests.torch.cuda_cases", 2, (), 3)
