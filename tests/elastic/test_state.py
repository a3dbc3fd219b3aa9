"""hora.elastic's state and loop, and hora.torch.elastic's TorchState and ElasticSampler, in one process."""

from __future__ import annotations

from collections.abc import Iterator

import hora
import hora.torch as hvd
import numpy as np
import pytest
import torch
from hora import basics
from hora.elastic import HostsUpdatedInterrupt, HostUpdateResult, ObjectState, run_fn
from hora.exceptions import HoraInternalError, RemovedFromJobError
from hora.torch.elastic import ElasticSampler, TorchState


@pytest.fixture
def one_rank() -> Iterator[None]:
    hora.init()
    yield
    hora.shutdown()


def _world(monkeypatch: pytest.MonkeyPatch, size: int, rank: int) -> None:
    monkeypatch.setattr(basics, "size", lambda: size)
    monkeypatch.setattr(basics, "rank", lambda: rank)


def _samplers(monkeypatch: pytest.MonkeyPatch, size: int, state: dict | None, length: int) -> list[ElasticSampler]:
    """One sampler per rank of a job of ``size``, loaded with ``state`` (as TorchState's sync does)."""
    samplers = []
    for rank in range(size):
        _world(monkeypatch, size, rank)
        sampler = ElasticSampler(range(length), shuffle=True, seed=3)
        if state is not None:
            sampler.load_state_dict(state)
        samplers.append(sampler)
    return samplers


def _steps(samplers: list[ElasticSampler], batch: int, steps: int) -> list[int]:
    """``steps`` batches on every rank; returns the indices processed and records them on every sampler."""
    taken: list[int] = []
    orders = [list(s) for s in samplers]
    for step in range(steps):
        for order in orders:
            taken += order[step * batch : (step + 1) * batch]
        for sampler in samplers:
            sampler.record_batch(step, batch)
    return taken


def test_the_sampler_sees_every_sample_once_per_epoch_across_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    samplers = _samplers(monkeypatch, 3, None, 60)
    seen = _steps(samplers, 4, 2)  # 3 ranks x 4 x 2 = 24
    samplers = _samplers(monkeypatch, 2, samplers[0].state_dict(), 60)  # a worker died
    assert len(samplers[0]) == 18
    seen += _steps(samplers, 6, 1)
    samplers = _samplers(monkeypatch, 4, samplers[1].state_dict(), 60)  # two joined
    seen += _steps(samplers, 3, 2)
    assert sorted(seen) == list(range(60))
    assert samplers[0].state_dict() == {"epoch": 0, "processed_num": 60}
    samplers[0].set_epoch(1)
    assert samplers[0].processed_num == 0 and len(samplers[0]) == 15
    assert list(samplers[0]) != list(_samplers(monkeypatch, 4, None, 60)[0])  # another order each epoch


def test_the_sampler_pads_the_last_round_from_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    samplers = _samplers(monkeypatch, 4, {"epoch": 0, "processed_num": 50}, 60)
    orders = [list(s) for s in samplers]
    assert [len(o) for o in orders] == [3, 3, 3, 3]
    flat = sorted(i for o in orders for i in o)
    remaining = samplers[0].remaining_indices
    assert sorted(set(flat)) == sorted(remaining) and len(flat) - len(set(flat)) == 2
    assert len(_samplers(monkeypatch, 4, {"epoch": 0, "processed_num": 70}, 60)[0]) == 0


def test_an_object_state_commits_restores_and_raises_on_host_updates(one_rank: None) -> None:
    state = ObjectState(epoch=0, seen=[])
    state.epoch, state.seen = 3, [1]
    state.commit()
    state.epoch, state.seen = 4, [1, 2]
    state.restore()
    assert (state.epoch, state.seen) == (3, [1])
    state.on_hosts_updated(1, HostUpdateResult.removed)
    state.on_hosts_updated(2, HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt) as removed:
        state.commit()
    assert removed.value.skip_sync
    state.commit()  # seen already
    state.on_hosts_updated(3, HostUpdateResult.added)
    state.on_hosts_updated(1, HostUpdateResult.removed)  # older than the last seen: ignored
    with pytest.raises(HostsUpdatedInterrupt) as added:
        state.commit()
    assert not added.value.skip_sync


def test_run_restores_after_a_failed_collective_and_syncs_after_the_reset(one_rank: None) -> None:
    calls: list[str] = []
    state = ObjectState(step=0)
    state.register_reset_callbacks([lambda: calls.append("callback")])

    def train(state: ObjectState) -> int:
        calls.append(f"train from {state.step}")
        state.step += 5
        if len(calls) == 1:
            raise HoraInternalError("a peer died")
        return state.step

    def reset() -> None:
        calls.append("reset")

    assert run_fn(train, reset)(state) == 5
    assert calls == ["train from 0", "reset", "callback", "train from 0"]


def test_a_set_given_to_init_with_every_rank_is_the_global_set_as_in_horovod() -> None:
    given = hora.ProcessSet([0])
    hora.init(process_sets=[given])  # a job of one rank: [0] is every rank
    try:
        assert given.process_set_id == 0
        assert hora.remove_process_set(given) is False and given.process_set_id == 0  # the global set stays
        assert hora.allreduce(np.array([3.0]), op=hora.Sum, process_set=given).tolist() == [3.0]
    finally:
        hora.shutdown()
    assert given.process_set_id is None  # a set ends with its job


def test_run_ends_a_worker_that_the_job_goes_on_without(one_rank: None) -> None:
    def train(state: ObjectState) -> None:
        raise HostsUpdatedInterrupt(skip_sync=True)

    def reset() -> None:
        raise RemovedFromJobError("gone")

    with pytest.raises(SystemExit) as ended:
        run_fn(train, reset)(ObjectState())
    assert ended.value.code == 0


def test_torch_state_restores_the_model_optimizer_and_attributes(one_rank: None) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = TorchState(model, optimizer, epoch=0)
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
    state.epoch = 1
    model(torch.ones(4, 2)).sum().backward()  # a step cut short after backward: its exchange is in flight
    state.restore()
    hora.shutdown()  # the job re-forms, as run() does
    hora.init()
    assert state.epoch == 0 and optimizer.state_dict()["state"] == {}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    optimizer.zero_grad()  # the abandoned exchange is forgotten
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    other = torch.nn.Linear(2, 1)
    state.model = other  # a handled attribute assigned anew is saved at once
    other.weight.data.fill_(7.0)
    state.restore()
    assert state.model is other and not torch.equal(other.weight, torch.full_like(other.weight, 7.0))
