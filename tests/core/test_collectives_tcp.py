"""Every collective over TCP between real processes, worlds of 1 to 4 ranks."""

import re
import sys

import pytest

from tests.conftest import horarun


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_collective_matches_numpy(size: int) -> None:
    result = horarun("-np", str(size), sys.executable, "-m", "tests.core.collective_cases", timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summaries = re.findall(r"\[(\d+)\]<stdout>:rank \1: (\d+) of (\d+) cases passed", result.stdout)
    assert sorted(int(r) for r, _, _ in summaries) == list(range(size))
    assert all(passed == total and int(total) > 200 for _, passed, total in summaries), summaries
