"""Every worker sees HORA_RANK ... (and the HOROVOD_* names) before init, equal to what init assigns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hora.runner.rank_env import rank_variables

from tests.conftest import horarun

NAMES = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")

# Prints what the environment said before init next to what init assigned.
COMPARE = (
    "import json, os, socket\n"
    "names = ('RANK', 'SIZE', 'LOCAL_RANK', 'LOCAL_SIZE', 'CROSS_RANK', 'CROSS_SIZE', 'HOSTNAME')\n"
    "before = {f'{p}_{n}': os.environ.get(f'{p}_{n}') for p in ('HORA', 'HOROVOD') for n in names}\n"
    "import hora\n"
    "hora.init()\n"
    "after = [hora.rank(), hora.size(), hora.local_rank(), hora.local_size(), hora.cross_rank(), hora.cross_size()]\n"
    "print('PLACE', json.dumps({'before': before, 'after': after}))\n"
)


def test_rank_variables_follow_horovods_placement() -> None:
    placed = rank_variables(["a", "a", "b", "b", "c"])
    got = [tuple(int(v[f"HORA_{n}"]) for n in NAMES[:-1]) for v in placed]
    # rank, size, local_rank, local_size, cross_rank, cross_size
    assert got == [(0, 5, 0, 2, 0, 3), (1, 5, 1, 2, 0, 2), (2, 5, 0, 2, 1, 3), (3, 5, 1, 2, 1, 2), (4, 5, 0, 1, 2, 3)]
    assert [v["HORA_HOSTNAME"] for v in placed] == ["a", "a", "b", "b", "c"]
    assert all(v[f"HOROVOD_{n}"] == v[f"HORA_{n}"] for v in placed for n in NAMES)
    assert rank_variables([]) == []


def test_a_host_listed_twice_gets_contiguous_ranks_as_the_driver_assigns() -> None:
    placed = rank_variables(["a", "b", "a"])
    assert [v["HORA_RANK"] for v in placed] == ["0", "2", "1"]
    assert [v["HORA_LOCAL_RANK"] for v in placed] == ["0", "0", "1"]


def _places(stdout: str) -> dict[int, dict]:
    places = {}
    for line in stdout.splitlines():
        if "PLACE " in line:
            place = json.loads(line.split("PLACE ", 1)[1])
            places[place["after"][0]] = place
    return places


@pytest.mark.timeout(90)
def test_horarun_exports_the_placement_before_init(fake_ssh: tuple[dict[str, str], Path]) -> None:
    env, _ = fake_ssh
    result = horarun("-H", "localhost:2,nodeb:1", "--network-interface", "lo", sys.executable, "-c", COMPARE, env=env)
    assert result.returncode == 0, result.stderr
    places = _places(result.stdout)
    assert sorted(places) == [0, 1, 2]
    hosts = {0: "localhost", 1: "localhost", 2: "nodeb"}
    for rank, place in places.items():
        for prefix in ("HORA", "HOROVOD"):
            before = [int(place["before"][f"{prefix}_{n}"]) for n in NAMES[:-1]]
            assert before == place["after"], (prefix, place)
            assert place["before"][f"{prefix}_HOSTNAME"] == hosts[rank]
    assert [places[r]["after"][4:] for r in range(3)] == [[0, 2], [0, 1], [1, 2]]  # cross rank and size
