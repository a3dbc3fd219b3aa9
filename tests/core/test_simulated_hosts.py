"""Jobs across simulated hosts (network namespaces joined by veth links): TCP between hosts, shared memory within.

Needs root; skipped elsewhere. Speed over rate-limited links is measured in
``bench/hosts.py``, not here.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.netns import SimulatedHosts, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

CASES = [sys.executable, "-m", "tests.core.collective_cases"]


def reports(outputs: list, what: str) -> list[str]:
    found = []
    for rank, output in enumerate(outputs):
        match = re.search(rf"rank {rank} {what}: (\S+)", output.output)
        assert match, output.output[-3000:]
        found.append(match.group(1))
    return found


def assert_all_passed(outputs: list) -> None:
    for rank, output in enumerate(outputs):
        assert output.returncode == 0, output.output[-4000:]
        match = re.search(rf"rank {rank}: (\d+) of (\d+) cases passed", output.output)
        assert match and match.group(1) == match.group(2), output.output[-4000:]


@pytest.mark.timeout(300)
def test_one_rank_per_host_rings_over_tcp() -> None:
    with SimulatedHosts(3) as hosts:
        outputs = hosts.run_job([0, 1, 2], CASES)
    assert_all_passed(outputs)
    assert reports(outputs, "links") == ["self,tcp,tcp", "tcp,self,tcp", "tcp,tcp,self"]
    assert reports(outputs, "hierarchical") == ["False"] * 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags", [{}, {"HORA_HIERARCHICAL_ALLREDUCE": "0"}], ids=["hierarchical", "flat"])
def test_two_hosts_of_two_share_memory_within_and_tcp_across(flags: dict[str, str]) -> None:
    with SimulatedHosts(2) as hosts:
        outputs = hosts.run_job([0, 0, 1, 1], CASES, env=flags)
    assert_all_passed(outputs)
    assert reports(outputs, "links") == ["self,shm,tcp,tcp", "shm,self,tcp,tcp", "tcp,tcp,self,shm", "tcp,tcp,shm,self"]
    assert reports(outputs, "hierarchical") == [str(not flags)] * 4


@pytest.mark.timeout(300)
def test_one_host_name_in_two_namespaces_falls_back_to_tcp() -> None:
    # Same host identity, but no shared abstract sockets: the pair cannot set
    # up shared memory, says so, and agrees on TCP.
    with SimulatedHosts(2) as hosts:
        outputs = hosts.run_job([0, 1], CASES, hostnames=["node", "node"])
    assert_all_passed(outputs)
    assert reports(outputs, "links") == ["self,tcp", "tcp,self"]
    assert "shared memory with a peer on this host failed, using TCP" in outputs[1].output
