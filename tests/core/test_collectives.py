"""Every collective between real processes, worlds of 1 to 4 ranks, over each placement of links.

``shm``: one host, every pair shares memory. ``tcp``: one host with
``--transport tcp``. ``mixed``: two host identities on this machine, so
pairs within a "host" share memory and pairs across use TCP; with two ranks
on each, allreduce runs hierarchically unless ``--no-hierarchical-allreduce``
(``mixed-flat``).
"""

import pathlib
import re
import sys

import pytest

from tests.conftest import horarun
from tests.pages import huge_pages_possible

MIXED_4 = [
    ["self", "shm", "tcp", "tcp"],
    ["shm", "self", "tcp", "tcp"],
    ["tcp", "tcp", "self", "shm"],
    ["tcp", "tcp", "shm", "self"],
]
# (placement, size) -> (horarun arguments, the links each rank must report)
PLACEMENTS = {
    ("single", 1): ((), [["self"]]),
    **{("shm", n): ((), [["self" if p == r else "shm" for p in range(n)] for r in range(n)]) for n in (2, 3, 4)},
    **{
        ("tcp", n): (("--transport", "tcp"), [["self" if p == r else "tcp" for p in range(n)] for r in range(n)])
        for n in (2, 3, 4)
    },
    ("mixed", 3): (
        ("-H", "localhost:2,127.0.0.1:1"),
        [["self", "shm", "tcp"], ["shm", "self", "tcp"], ["tcp", "tcp", "self"]],
    ),
    ("mixed", 4): (("-H", "localhost:2,127.0.0.1:2"), MIXED_4),
    ("mixed-flat", 4): (("-H", "localhost:2,127.0.0.1:2", "--no-hierarchical-allreduce"), MIXED_4),
}
HIERARCHICAL = {("mixed", 4)}


def single_copy_expected(links: list[str]) -> list[bool]:
    """Which links pass large messages by reference: shared memory, where the kernel lets a rank read its peer.

    Under Yama's ptrace_scope=1 a rank may only name its one peer on the host (3 and up: none); no Yama, or 0:
    every shared-memory pair.
    """
    yama = pathlib.Path("/proc/sys/kernel/yama/ptrace_scope")
    scope = int(yama.read_text()) if yama.exists() else 0
    allowed = scope == 0 or (scope == 1 and links.count("shm") == 1)
    return [link == "shm" and allowed for link in links]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("placement", "size"), list(PLACEMENTS), ids=[f"{p}-{n}" for p, n in PLACEMENTS])
def test_every_collective_matches_numpy(placement: str, size: int) -> None:
    arguments, links = PLACEMENTS[placement, size]
    result = horarun("-np", str(size), *arguments, sys.executable, "-m", "tests.core.collective_cases", timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    reported = dict(re.findall(r"\[\d+\]<stdout>:rank (\d+) links: (\S+)", result.stdout))
    assert {int(r): kinds.split(",") for r, kinds in reported.items()} == dict(enumerate(links))
    # The large messages of the cases crossed by reference, between processes, wherever a link allows it and from
    # huge pages (tests/pages.py).
    single_copy = dict(re.findall(r"\[\d+\]<stdout>:rank (\d+) single copy: (\S+)", result.stdout))
    expected = {r: single_copy_expected(kinds) for r, kinds in enumerate(links)}
    assert {int(r): [flag == "1" for flag in flags.split(",")] for r, flags in single_copy.items()} == expected
    sent = dict(re.findall(r"\[\d+\]<stdout>:rank (\d+) sent by reference: (\S+)", result.stdout))
    sent = {int(r): [int(n) for n in counts.split(",")] for r, counts in sent.items()}
    assert sorted(sent) == list(range(size))
    assert (sum(map(sum, sent.values())) > 0) == (any(map(any, expected.values())) and huge_pages_possible()), sent
    hierarchical = re.findall(r"\[\d+\]<stdout>:rank \d+ hierarchical: (\w+)", result.stdout)
    assert hierarchical == [str((placement, size) in HIERARCHICAL)] * size
    summaries = re.findall(r"\[(\d+)\]<stdout>:rank \1: (\d+) of (\d+) cases passed", result.stdout)
    assert sorted(int(r) for r, _, _ in summaries) == list(range(size))
    assert all(passed == total and int(total) > 200 for _, passed, total in summaries), summaries
