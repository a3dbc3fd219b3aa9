"""hora.jax between real processes: every collective and dtype eagerly and under jit, gradients, training."""

from __future__ import annotations

import pytest

from tests.torch.test_torch import run_worker

pytest.importorskip("jax", reason="needs jax: pip install 'hora[jax]'")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 3])
def test_worker_cases(ranks: int) -> None:
    run_worker("tests.jax.op_cases", ranks, (), 145)
