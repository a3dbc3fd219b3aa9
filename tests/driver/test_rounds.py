"""Rendezvous rounds: shutdown() then init() registers again and gets the same rank."""

from __future__ import annotations

import threading
import time

import pytest
from hora.driver import Assignment, DriverService, register
from hora.exceptions import RendezvousError

SECRET = bytes(range(32))
pytestmark = pytest.mark.timeout(60)


def _round(service: DriverService, hosts: list[str], number: int, port_base: int, timeout: float = 5) -> list[object]:
    """Registers one worker per host for round ``number``, all at once; each result is an Assignment or the error."""
    results: list[object] = [None] * len(hosts)

    def one(index: int) -> None:
        try:
            results[index] = register(
                service.address,
                SECRET,
                index=index,
                host=hosts[index],
                address=("127.0.0.1", port_base + index),
                timeout=timeout,
                round_number=number,
            )
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hosts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 15)
    return results


@pytest.mark.parametrize("hosts", [["a", "a"], ["a", "b", "a"]])
def test_every_round_gives_the_same_ranks_and_the_new_addresses(hosts: list[str]) -> None:
    with DriverService(len(hosts), SECRET, start_timeout=10) as service:
        rounds = [_round(service, hosts, number, port_base=6000 + 100 * number) for number in range(3)]
        assert service.wait(2)[0].peers == rounds[2][0].peers  # type: ignore[union-attr]
        assert service.wait()[0].peers == rounds[0][0].peers  # type: ignore[union-attr]  # what launchers wait for
        with pytest.raises(RendezvousError, match="Rendezvous round 1 has not started or is long over"):
            service.wait(1)
    for number, results in enumerate(rounds):
        assert all(isinstance(r, Assignment) for r in results), results
        assert [r.rank for r in results] == [r.rank for r in rounds[0]]  # type: ignore[union-attr]
        ports = sorted(port for _, port in results[0].peers)  # type: ignore[union-attr]
        assert ports == [6000 + 100 * number + i for i in range(len(hosts))]
    # Hosts a, b, a: index 2 shares host a with index 0, so it is rank 1 in every round.
    assert [r.rank for r in rounds[0]] == ([0, 1] if len(hosts) == 2 else [0, 2, 1])  # type: ignore[union-attr]


def test_registering_twice_in_one_round_is_refused() -> None:
    with DriverService(2, SECRET, start_timeout=10) as service:
        first = _round(service, ["a", "a"], 0, port_base=6000)
        again = _round(service, ["a"], 0, port_base=6100)
    assert [r.rank for r in first] == [0, 1]  # type: ignore[union-attr]
    assert isinstance(again[0], RendezvousError)
    assert "Worker index 0 registered twice in rendezvous round 0." in str(again[0])


def test_a_later_round_times_out_from_its_first_registration_and_names_itself() -> None:
    with DriverService(2, SECRET, start_timeout=1.0, expected_hosts={0: "a", 1: "b"}) as service:
        assert [r.rank for r in _round(service, ["a", "b"], 0, 6000)] == [0, 1]  # type: ignore[union-attr]
        time.sleep(1.5)  # training, longer than the start timeout: round 1 is not late for it
        assert [r.rank for r in _round(service, ["a", "b"], 1, 6100)] == [0, 1]  # type: ignore[union-attr]
        started = time.monotonic()
        lonely = _round(service, ["a"], 2, 6200)
        took = time.monotonic() - started
        stale = _round(service, ["a"], 0, 6300)
    assert isinstance(lonely[0], RendezvousError)
    assert str(lonely[0]).startswith(
        "In rendezvous round 2 (hora.init() after shutdown()), 1 of 2 workers registered after 1 s; "
        "missing ranks 1 on host b."
    )
    assert 0.9 <= took < 15.0  # its own 1 s deadline; the upper bound only guards against a hang
    assert isinstance(stale[0], RendezvousError)
    assert "asked to join rendezvous round 0, but the job is already in round 1" in str(stale[0])
