"""Elastic rendezvous rounds: membership the launcher changes, survivors first, leave, deadlines, host updates."""

from __future__ import annotations

import threading

import pytest
from hora.driver import DriverService, ElasticRounds, HostUpdateResult, Registration, host_updates, join_round
from hora.exceptions import RemovedFromJobError, RendezvousError

SECRET = bytes(range(32))
pytestmark = pytest.mark.timeout(60)


def _join_all(rounds: ElasticRounds, workers: dict[int, str], number: int = 0) -> dict[int, object]:
    """Registers each ``index: host`` at once; each result: (round, Assignment), None or the error."""
    results: dict[int, object] = {}

    def one(index: int) -> None:
        try:
            results[index] = rounds.join(number, Registration(index, workers[index], ("127.0.0.1", 7000 + index)))
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def _joined_round_0(members: int, elastic_timeout: float = 10) -> ElasticRounds:
    """Rounds of ``members`` workers on one host, whose round 0 completed."""
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=elastic_timeout)
    for index in range(members):
        rounds.add(index, "a")
    rounds.open()
    _join_all(rounds, dict.fromkeys(range(members), "a"))
    return rounds


def _ranks(results: dict[int, object]) -> dict[int, int]:
    return {index: placed[1].rank for index, placed in results.items()}  # type: ignore[index]


def test_a_round_completes_with_every_member_and_survivors_keep_their_order() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10)
    for index, host in {0: "a", 1: "b", 2: "a"}.items():
        rounds.add(index, host)
    rounds.open()
    first = _join_all(rounds, {0: "a", 1: "b", 2: "a"})
    assert {i: r[0] for i, r in first.items()} == {0: 0, 1: 0, 2: 0}  # type: ignore[index]
    assert _ranks(first) == {0: 0, 2: 1, 1: 2}  # one host's ranks are contiguous
    # Worker 0 (rank 0) dies; worker 3 starts on host b. Rank 0 goes to a survivor, the new worker comes last.
    rounds.remove(0)
    rounds.add(3, "b")
    second = _join_all(rounds, {1: "b", 2: "a", 3: "b"}, number=1)
    assert {i: r[0] for i, r in second.items()} == {1: 1, 2: 1, 3: 1}  # type: ignore[index]
    assert _ranks(second) == {2: 0, 1: 1, 3: 2}
    places = {i: r[1] for i, r in second.items()}  # type: ignore[index]
    assert places[3].local_rank == 1 and places[3].local_size == 2 and places[2].local_size == 1
    assert places[2].peers[1] == ("127.0.0.1", 7001) and places[2].size == 3


def test_a_worker_started_mid_job_joins_the_open_round_whatever_it_counted() -> None:
    rounds = _joined_round_0(1)
    rounds.add(1, "a")
    results = _join_all(rounds, {0: "a", 1: "a"}, number=0)  # the new worker's first init counts round 0
    assert {i: r[0] for i, r in results.items()} == {0: 1, 1: 1}  # type: ignore[index]
    assert rounds.latest() == 2 and rounds.wait(1)[1].rank == 1


def test_a_dismissed_worker_is_told_to_leave_and_the_round_goes_on_without_it() -> None:
    rounds = _joined_round_0(3)
    rounds.dismiss(1)
    results = _join_all(rounds, {0: "a", 1: "a", 2: "a"}, number=1)
    assert results[1] is None
    assert _ranks({i: r for i, r in results.items() if i != 1}) == {0: 0, 2: 1}


def test_dismissing_a_registered_worker_frees_the_round() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10)
    for index in range(2):
        rounds.add(index, "a")
    rounds.open()
    waiting: dict[int, object] = {}
    thread = threading.Thread(target=lambda: waiting.update(_join_all(rounds, {1: "a"})))
    thread.start()
    while rounds.registered(0) != {1}:
        threading.Event().wait(0.01)
    rounds.dismiss(1)  # the round now waits for worker 0 only; worker 1 learns it must leave
    thread.join(10)
    assert waiting == {1: None}
    assert _ranks(_join_all(rounds, {0: "a"})) == {0: 0}


def test_a_round_below_min_workers_waits_for_more_and_fails_naming_the_hosts() -> None:
    rounds = ElasticRounds(min_workers=2, start_timeout=10, elastic_timeout=0.5, describe_hosts=lambda: "a:1")
    rounds.add(0, "a")
    rounds.add(1, "a")
    rounds.open()
    _join_all(rounds, {0: "a", 1: "a"})
    rounds.remove(1)
    results = _join_all(rounds, {0: "a"}, number=1)
    assert isinstance(results[0], RendezvousError)
    message = str(results[0])
    assert "round 1 did not complete within 0.5 s" in message
    assert "only 1 workers of the 2 needed (--min-np)" in message and "Hosts: a:1." in message
    assert rounds.failure() == message


def test_more_workers_arriving_in_time_complete_a_round_below_min_workers() -> None:
    rounds = ElasticRounds(min_workers=2, start_timeout=10, elastic_timeout=10)
    rounds.add(0, "a")
    rounds.add(1, "a")
    rounds.open()
    _join_all(rounds, {0: "a", 1: "a"})
    rounds.remove(1)
    late: dict[int, object] = {}
    thread = threading.Thread(target=lambda: late.update(_join_all(rounds, {0: "a"}, number=1)))
    thread.start()
    while rounds.registered(1) != {0}:
        threading.Event().wait(0.01)
    rounds.add(5, "b")
    late.update(_join_all(rounds, {5: "b"}))
    thread.join(10)
    assert _ranks(late) == {0: 0, 5: 1}


def test_unknown_and_twice_registered_workers_are_refused() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10)
    rounds.add(0, "a")
    rounds.add(1, "a")
    rounds.open()
    with pytest.raises(RendezvousError, match="Worker index 9 is not part of this elastic job"):
        rounds.join(0, Registration(9, "a", ("127.0.0.1", 1)))
    with pytest.raises(ValueError, match="Worker index 0 is already part of this job"):
        rounds.add(0, "b")
    threading.Thread(target=_join_all, args=(rounds, {0: "a"}), daemon=True).start()
    while rounds.registered(0) != {0}:
        threading.Event().wait(0.01)
    with pytest.raises(RendezvousError, match="Worker index 0 registered twice in rendezvous round 0"):
        rounds.join(0, Registration(0, "a", ("127.0.0.1", 2)))
    rounds.close()


def test_host_updates_accumulate_since_a_timestamp() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10)
    assert rounds.updates_since(0) == (0, HostUpdateResult.no_update)
    assert rounds.post_update(HostUpdateResult.added) == 1
    assert rounds.post_update(HostUpdateResult.removed) == 2
    assert rounds.updates_since(0) == (2, HostUpdateResult.mixed)
    assert rounds.updates_since(1) == (2, HostUpdateResult.removed)
    assert rounds.updates_since(2) == (2, HostUpdateResult.no_update)


def test_workers_added_are_announced_once_they_registered_so_the_others_train_on_meanwhile() -> None:
    rounds = _joined_round_0(1)
    rounds.add(1, "b")
    rounds.add(2, "b")
    assert rounds.post_update(HostUpdateResult.added) == 0  # neither new worker has registered: not yet
    assert rounds.post_update(HostUpdateResult.removed) == 1  # what is not about them is not held back
    newcomers = threading.Thread(target=_join_all, args=(rounds, {1: "b"}, 1), daemon=True)
    newcomers.start()
    while rounds.registered(1) != {1}:
        threading.Event().wait(0.01)
    assert rounds.updates_since(1) == (1, HostUpdateResult.no_update)  # worker 2 is still starting
    rounds.remove(2)  # it died before registering: worker 1 is announced alone
    assert rounds.updates_since(1) == (2, HostUpdateResult.added)
    assert _ranks(_join_all(rounds, {0: "a"}, 1)) == {0: 0}  # worker 0 re-forms at its next commit
    newcomers.join(10)
    assert rounds.current() == {0, 1}


def test_an_added_worker_that_never_registers_is_never_announced() -> None:
    rounds = _joined_round_0(1)
    rounds.add(1, "b")
    rounds.post_update(HostUpdateResult.added)
    rounds.remove(1)
    assert rounds.updates_since(0) == (0, HostUpdateResult.no_update)  # nothing for worker 0 to re-form for


def test_the_service_places_workers_tells_them_to_leave_and_answers_host_updates() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10)
    rounds.add(0, "a")
    rounds.add(1, "a")
    with DriverService(2, SECRET, elastic=rounds) as service:
        rounds.dismiss(1)
        with pytest.raises(RemovedFromJobError, match="Worker index 1 on host a is no longer part of its elastic job"):
            join_round(service.address, SECRET, index=1, host="a", address=("127.0.0.1", 1), timeout=5)
        joined = join_round(
            service.address, SECRET, index=0, host="a", address=("127.0.0.1", 1), timeout=5, round_number=3
        )
        assert (joined.round, joined.assignment.rank, joined.assignment.size, joined.host_updates) == (0, 0, 1, 0)
        rounds.post_update(HostUpdateResult.added)
        rounds.remove(0)
        rounds.add(2, "b")
        joined = join_round(service.address, SECRET, index=2, host="b", address=("127.0.0.1", 2), timeout=5)
        assert (joined.round, joined.assignment.rank, joined.host_updates) == (1, 0, 1)
        assert host_updates(service.address, SECRET, 0, timeout=5) == (1, HostUpdateResult.added)


def test_a_round_past_the_reset_limit_fails_the_job() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10, reset_limit=1)
    rounds.add(0, "a")
    rounds.open()
    for number in range(2):
        assert _ranks(_join_all(rounds, {0: "a"}, number)) == {0: 0}
    failed = _join_all(rounds, {0: "a"}, 2)[0]
    assert isinstance(failed, RendezvousError)
    assert (
        str(failed)
        == rounds.failure()
        == ("Hora stopped the elastic job because the number of resets exceeded its limit: 1 (--reset-limit).")
    )


def test_open_membership_admits_workers_that_register_up_to_max_and_finish_sends_late_ones_away() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=10, open_membership=True, max_workers=2,
                           first_workers=2)  # fmt: skip
    rounds.open()
    first = _join_all(rounds, {0: "a", 1: "a"})  # round 0 waits for both (first_workers), then completes
    assert _ranks(first) == {0: 0, 1: 1}
    assert rounds.updates_since(0)[0] == 2  # each worker admitted posted an update (round 0 reflects both)
    assert first[0][2] == 2  # type: ignore[index]
    assert _join_all(rounds, {7: "a"})[7] is None  # a third would pass max_workers: it leaves
    rounds.remove(1)
    late: dict[int, object] = {}
    thread = threading.Thread(target=lambda: late.update(_join_all(rounds, {5: "b"})))
    thread.start()
    while rounds.registered(1) != {5}:
        threading.Event().wait(0.01)
    rounds.finish()  # worker 0 returned: training is over, and worker 5 has nothing to join
    thread.join(10)
    assert late == {5: None}
    assert _join_all(rounds, {9: "a"})[9] is None


def test_a_new_worker_starts_no_clock_and_the_round_says_it_is_fresh() -> None:
    rounds = ElasticRounds(min_workers=1, start_timeout=10, elastic_timeout=0.5)
    rounds.add(0, "a")
    rounds.open()
    assert _join_all(rounds, {0: "a"})[0][3] is False  # type: ignore[index]  # round 0: everyone syncs anyway
    rounds.add(1, "a")
    late: dict[int, object] = {}
    thread = threading.Thread(target=lambda: late.update(_join_all(rounds, {1: "a"})))
    thread.start()
    threading.Event().wait(0.3)  # past its own wait it would fail alone: the others' commit is near
    late.update(_join_all(rounds, {0: "a"}, number=1))  # training went on past the elastic timeout's half
    thread.join(10)
    assert rounds.failure() is None
    assert {i: r[3] for i, r in late.items()} == {0: True, 1: True}  # type: ignore[index]  # sync: 1 is new
    assert _join_all(rounds, {0: "a", 1: "a"}, number=2)[0][3] is False  # type: ignore[index]  # the same two


def test_a_new_worker_that_waits_too_long_fails_alone() -> None:
    rounds = _joined_round_0(1, elastic_timeout=0.5)
    rounds.add(1, "a")
    alone = _join_all(rounds, {1: "a"})[1]  # worker 0 never commits within the elastic timeout
    assert isinstance(alone, RendezvousError) and "did not reach a commit (state.commit())" in str(alone)
    assert rounds.failure() is None and rounds.registered(1) == set()  # the job goes on


def test_losing_a_worker_of_the_last_round_starts_the_clock() -> None:
    rounds = _joined_round_0(3, elastic_timeout=0.5)
    rounds.remove(2)
    threading.Event().wait(0.7)
    failed = _join_all(rounds, {0: "a"}, number=1)[0]  # worker 1 never comes: the clock ran from the loss
    assert isinstance(failed, RendezvousError) and "round 1 did not complete within 0.5 s" in str(failed)
