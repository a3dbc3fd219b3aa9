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
    "autograd-2": ("tests.torch.autograd_cases", 2, (), 12),
    "autograd-3": ("tests.torch.autograd_cases", 3, (), 12),
    "training-2": ("tests.torch.training_cases", 2, (), 25),
    "training-3": ("tests.torch.training_cases", 3, (), 25),
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


@pytest.mark.timeout(200)
def test_digits_example_reaches_95_percent() -> None:
    result = horarun("-np", "2", sys.executable, "examples/torch/digits.py", "--epochs", "15", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    epochs = re.findall(r"\[0\]<stdout>:epoch +(\d+) +loss ([\d.]+) +accuracy ([\d.]+)", result.stdout)
    assert [int(e) for e, _, _ in epochs] == list(range(1, 16))
    assert float(epochs[-1][1]) < float(epochs[0][1])  # it learned
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy ([\d.]+) on 450 images", result.stdout).group(1))
    assert accuracy >= 0.95, result.stdout[-2000:]
    assert "[1]<stdout>:epoch" not in result.stdout  # rank 0 alone reports


@pytest.mark.timeout(120)
def test_synthetic_benchmark_example_runs() -> None:
    arguments = ["--model", "mlp", "--num-iters", "2", "--num-batches-per-iter", "2", "--num-warmup-batches", "1"]
    result = horarun("-np", "2", sys.executable, "examples/torch/synthetic_benchmark.py", *arguments, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"Total img/sec on 2 rank\(s\): [\d.]+ \+-[\d.]+", result.stdout), result.stdout[-2000:]
