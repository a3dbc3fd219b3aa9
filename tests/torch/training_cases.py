"""Worker script: DistributedOptimizer and state broadcast, against single-process training.

The reference is computed on every rank without Hora: the same model, seed
and optimizer trained on the whole batch of ``size * b`` rows. With
DistributedOptimizer each rank trains on its ``b`` rows; averaging the
gradients must give the same parameters after every step (float64, so the
comparison is tight).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import hora.torch as hvd
import torch

from tests.worker import run_cases

BATCH = 8  # rows per rank
STEPS = 4


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()


def data(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 6, generator=generator, dtype=torch.float64), torch.randn(
        rows, 3, generator=generator, dtype=torch.float64
    )


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def horovod_initialization(optimizer: torch.optim.Optimizer) -> None:
    """What Horovod 0.28.1's broadcast_optimizer_state does to a fresh optimizer, by hand in one process.

    Every parameter that requires grad gets a zero gradient (sparse for
    SparseAdam), replacing any it had, and the optimizer takes one step.
    """
    assert not optimizer.state_dict()["state"]
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    optimizer.step()


def reference(make_optimizer: Callable, size: int) -> list[torch.Tensor]:
    """Single-process training with Horovod's semantics: the distributed run's broadcast_optimizer_state
    initialised the fresh optimizer, so the reference does the same."""
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    horovod_initialization(optimizer)
    for step in range(STEPS):
        x, y = data(step, size * BATCH)
        optimizer.zero_grad()
        loss_of(model, x, y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def distributed(make_optimizer: Callable, rank: int, passes: int = 1, **options) -> list[torch.Tensor]:
    model = make_model(seed=rank)  # different on purpose: the broadcast must fix it
    optimizer = hvd.DistributedOptimizer(
        make_optimizer(model.parameters()),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        **options,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for step in range(STEPS):
        x, y = data(step, hvd.size() * BATCH)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        optimizer.zero_grad()
        micro = BATCH // passes
        for k in range(passes):
            part = slice(mine.start + k * micro, mine.start + (k + 1) * micro)
            (loss_of(model, x[part], y[part]) / passes).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "Adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def cases(rank: int, size: int):
    for name, make in OPTIMIZERS.items():

        def equivalent(make=make):
            for got, want in zip(distributed(make, rank), reference(make, size), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

        yield f"{size} ranks x batch b == 1 rank x batch {size}b ({name})", equivalent

        def accumulated(make=make):
            for got, want in zip(distributed(make, rank, passes=2), reference(make, size), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

        yield f"backward_passes_per_step=2 ({name})", accumulated

    def grouped():
        make = OPTIMIZERS["SGD"]
        for got, w in zip(distributed(make, rank, groups=2), reference(make, size), strict=True):
            torch.testing.assert_close(got, w, rtol=1e-9, atol=1e-12)

    yield "groups=2", grouped

    def explicit_groups():
        model = make_model()
        params = list(model.parameters())
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.1), named_parameters=model.named_parameters(), groups=[params[:2], params[2:3]]
        )
        x, y = data(0, size * BATCH)
        loss_of(model, x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]).backward()
        optimizer.step()
        reference_model = make_model()
        reference_opt = torch.optim.SGD(reference_model.parameters(), lr=0.1)
        loss_of(reference_model, x, y).backward()
        reference_opt.step()
        for got, want in zip(model.parameters(), reference_model.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    yield "groups as lists of parameters", explicit_groups

    def fp16():
        make = OPTIMIZERS["SGD"]
        for got, want in zip(
            distributed(make, rank, compression=hvd.Compression.fp16), reference(make, size), strict=True
        ):
            torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)

    yield "fp16 compression", fp16

    def missing_gradient():
        # Only rank 0 uses the second head: the others still take part, with zeros.
        torch.manual_seed(3)
        trunk, head = torch.nn.Linear(2, 2).double(), torch.nn.Linear(2, 1).double()
        params = [*trunk.parameters(), *head.parameters()]
        named = [*(("trunk." + n, p) for n, p in trunk.named_parameters()),
                 *(("head." + n, p) for n, p in head.named_parameters())]  # fmt: skip
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named)
        before = head.weight.detach().clone()
        out = trunk(torch.ones(1, 2, dtype=torch.float64))
        loss = out.sum() + (head(out).sum() if rank == 0 else 0)
        loss.backward()
        optimizer.step()
        # rank 0's head gradient, averaged with zeros from the other ranks
        expected_grad = out.detach() / size
        expected = before - expected_grad if rank == 0 else None
        got = hvd.broadcast(head.weight.detach(), root_rank=0)
        torch.testing.assert_close(head.weight.detach(), got)
        if rank == 0:
            torch.testing.assert_close(head.weight.detach(), expected)

    yield "a parameter with no gradient on some ranks", missing_gradient

    def bursts():
        # Gradients reach the engine in bursts of about 1 MiB and the rest when backward ends: this model's
        # 2 MiB layer closes a burst in mid-backward. The result must not depend on where the bursts fall.
        def build() -> torch.nn.Module:
            torch.manual_seed(5)
            return torch.nn.Sequential(
                torch.nn.Linear(6, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                torch.nn.Linear(512, 3),
            ).double()  # fmt: skip

        model, reference_model = build(), build()
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
        )
        reference_opt = torch.optim.SGD(reference_model.parameters(), lr=0.1)
        for step in range(STEPS):
            x, y = data(step, size * BATCH)
            optimizer.zero_grad()
            loss_of(model, x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]).backward()
            assert len({id(handle) for handle, _, _ in optimizer._handles.values()}) >= 2, "expected several bursts"
            optimizer.step()
            reference_opt.zero_grad()
            loss_of(reference_model, x, y).backward()
            reference_opt.step()
        for got, want in zip(model.parameters(), reference_model.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    yield "gradients submitted in several bursts", bursts

    def mismatched_shapes():
        model = torch.nn.Linear(3, 2 + rank)  # a different shape on every rank
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())  # fmt: skip
        model(torch.ones(1, 3)).sum().backward()
        try:
            optimizer.step()
        except ValueError as exc:
            assert "ranks disagree on the shape" in str(exc) and "allreduce.bias" in str(exc), exc
        else:
            raise AssertionError("mismatched parameter shapes did not raise")
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [size] * 2  # the job goes on

    yield "mismatched parameter shapes raise, not hang", mismatched_shapes

    def protocol():
        model = torch.nn.Linear(2, 1)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())  # fmt: skip
        model(torch.ones(1, 2)).sum().backward()
        try:
            optimizer.zero_grad()
        except RuntimeError as exc:
            assert "still in flight" in str(exc)
        else:
            raise AssertionError("zero_grad during the allreduce did not raise")
        optimizer.synchronize()
        with optimizer.skip_synchronize(), warnings.catch_warnings():
            warnings.simplefilter("error")
            optimizer.step()
        model(torch.ones(1, 2)).sum().backward()
        try:
            model(torch.ones(1, 2)).sum().backward()
        except RuntimeError as exc:
            assert "more than backward_passes_per_step=1" in str(exc), exc
        else:
            raise AssertionError("a second backward before step did not raise")
        optimizer.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer.step()
        assert any("skip_synchronize" in str(w.message) for w in caught), caught
        assert isinstance(optimizer, torch.optim.SGD)

    yield "zero_grad, skip_synchronize, step warnings", protocol

    def bad_arguments():
        model = torch.nn.Linear(2, 1)
        for kwargs, text in [
            ({"backward_passes_per_step": 0}, "backward_passes_per_step must be a positive integer, got 0"),
            ({"named_parameters": [("w", model.weight)]}, "are not named"),
            ({"named_parameters": [("w", model.weight), ("w", model.bias)]}, "duplicate names: ['w']"),
            ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, "needs op=hora.Average"),
        ]:
            try:
                hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
            except ValueError as exc:
                assert text in str(exc), (text, str(exc))
            else:
                raise AssertionError(f"no error for {kwargs}")

    yield "bad DistributedOptimizer arguments", bad_arguments

    def predivide():
        make = OPTIMIZERS["SGD"]
        for got, want in zip(
            distributed(make, rank, gradient_predivide_factor=float(size)), reference(make, size), strict=True
        ):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    yield "gradient_predivide_factor", predivide

    def sparse():
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 3, sparse=True).double()
        hvd.broadcast_parameters(embedding.state_dict(), root_rank=0)
        before = embedding.weight.detach().clone()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0),
                                             named_parameters=embedding.named_parameters())  # fmt: skip
        embedding(torch.tensor([rank, 9])).sum().backward()
        optimizer.step()
        counts = torch.zeros(10, dtype=torch.float64)
        for r in range(size):
            counts[r] += 1
            counts[9] += 1
        torch.testing.assert_close(embedding.weight.detach(), before - (counts / size)[:, None].expand(10, 3))

    yield "sparse gradients (allgathered)", sparse

    yield from sparse_cases(rank, size)
    yield from state_cases(rank, size)


def lookups(rank: int, step: int) -> torch.Tensor:
    """The rows rank ``rank`` looks up at ``step``: some shared with other ranks, some repeated."""
    return torch.tensor([rank % 7, (rank + step) % 7, 9, 9, step % 10])


def lookup_weights(rank: int, step: int) -> torch.Tensor:
    return torch.randn(5, 3, generator=torch.Generator().manual_seed(500 + 10 * rank + step), dtype=torch.float64)


def sparse_cases(rank: int, size: int):
    def sparse_adam(sparse_as_dense: bool) -> None:
        # SparseAdam needs sparse gradients: they must come out of the exchange sparse, averaged.
        def embedding() -> torch.nn.Embedding:
            torch.manual_seed(0)
            return torch.nn.Embedding(10, 3, sparse=True).double()

        reference = embedding()
        reference_opt = torch.optim.SparseAdam(reference.parameters(), lr=0.05)
        model = embedding()
        optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.05),
                                             named_parameters=model.named_parameters(),
                                             sparse_as_dense=sparse_as_dense)  # fmt: skip
        for step in range(3):
            reference_opt.zero_grad()
            loss = sum((reference(lookups(r, step)) * lookup_weights(r, step)).sum() for r in range(size)) / size
            loss.backward()
            reference_opt.step()
            optimizer.zero_grad()
            (model(lookups(rank, step)) * lookup_weights(rank, step)).sum().backward()
            optimizer.step()
            assert model.weight.grad.is_sparse
            torch.testing.assert_close(model.weight.detach(), reference.weight.detach(), rtol=1e-12, atol=1e-12)

    yield "SparseAdam on sparse gradients (allgathered)", lambda: sparse_adam(False)
    yield "SparseAdam with sparse_as_dense", lambda: sparse_adam(True)

    def sparse_allreduce():
        table = torch.zeros(6, 2, dtype=torch.float64)
        rows = list(range(rank + 1)) if rank != 1 else []  # rank 1 contributes nothing
        for i in rows:
            table[i] = torch.tensor([i + 1.0, rank + 1.0])
        everyone = torch.zeros(6, 2, dtype=torch.float64)
        for r in range(size):
            for i in list(range(r + 1)) if r != 1 else []:
                everyone[i] += torch.tensor([i + 1.0, r + 1.0])
        for op, expected in [(hvd.Sum, everyone), (hvd.Average, everyone / size)]:
            handle = hvd.sparse_allreduce_async(table.to_sparse(1), name=f"sparse.{op}", op=op)
            result = handle()  # Horovod's handle is a function
            assert result.is_sparse and result.shape == (6, 2)
            torch.testing.assert_close(result.to_dense(), expected)
        try:
            hvd.sparse_allreduce_async(table, name="dense")
        except TypeError as exc:
            assert "expects a sparse COO tensor, got a dense tensor of shape (6, 2)" in str(exc), exc
        else:
            raise AssertionError("a dense tensor was accepted")

    yield "sparse_allreduce_async (Sum, Average, a rank with no entries)", sparse_allreduce

    def process_set_optimizer():
        # Members average among themselves (divisor: the set's size); the others step on their own gradients,
        # as in Horovod, instead of submitting exchanges nobody matches.
        members = [0, 1] if size >= 3 else [0]
        subset = hvd.add_process_set(members)
        try:
            torch.manual_seed(0)
            embedding = torch.nn.Embedding(10, 3, sparse=True).double()
            dense = torch.nn.Linear(3, 1, bias=False).double()
            before = (embedding.weight.detach().clone(), dense.weight.detach().clone())
            params = [*embedding.parameters(), *dense.parameters()]
            named = [("embedding.weight", embedding.weight), ("dense.weight", dense.weight)]
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named,
                                                 process_set=subset)  # fmt: skip
            x = torch.full((1, 3), float(rank + 1), dtype=torch.float64)
            (embedding(lookups(rank, 0)) * lookup_weights(rank, 0)).sum().add(dense(x).sum()).backward()
            optimizer.step()

            contributors = members if rank in members else [rank]
            table_grad = torch.zeros(10, 3, dtype=torch.float64)
            for r in contributors:
                table_grad.index_add_(0, lookups(r, 0), lookup_weights(r, 0))
            dense_grad = sum(torch.full((1, 3), float(r + 1), dtype=torch.float64) for r in contributors)
            n = len(contributors)
            torch.testing.assert_close(embedding.weight.detach(), before[0] - table_grad / n, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(dense.weight.detach(), before[1] - dense_grad / n, rtol=1e-12, atol=1e-12)
        finally:
            hvd.remove_process_set(subset)

    yield "DistributedOptimizer(process_set=...): members average, the others step alone", process_set_optimizer


class ScalarStateSGD(torch.optim.SGD):
    """An optimizer whose state holds plain Python numbers."""

    def step(self, closure=None):
        result = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["calls"] = state.get("calls", 0) + 1
                state["scale"] = 0.5 * state["calls"]
        return result


def closure_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """One optimizer step through a closure (as LBFGS needs) on batch ``step`` of 4 rows."""
    x, y = data(step, 4)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss

    optimizer.step(closure)


def state_cases(rank: int, size: int):
    def identical_after_broadcast(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        mine = {"params": [p.detach() for p in model.parameters()], "optimizer": optimizer.state_dict()}
        everyone = hvd.allgather_object(mine)
        for other in everyone:
            for a, b in zip(other["params"], everyone[0]["params"], strict=True):
                assert torch.equal(a, b)
            assert repr(other["optimizer"]) == repr(everyone[0]["optimizer"]), (other["optimizer"], everyone[0])

    for name, make in [
        ("Adam", lambda ps: torch.optim.Adam(ps, lr=0.01 * (1 + hvd.rank()))),
        ("SGD with momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        ("scalar state", lambda ps: ScalarStateSGD(ps, lr=0.1)),
    ]:

        def broadcast_state(make=make):
            model = make_model(seed=rank)
            optimizer = make(model.parameters())
            for step in range(2 if rank == 0 else 0):  # the root has state; the others have none yet
                closure_step(model, optimizer, step)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            identical_after_broadcast(model, optimizer)
            closure_step(model, optimizer, 9)  # and they stay identical after one more step everywhere
            identical_after_broadcast(model, optimizer)

        yield f"broadcast_optimizer_state ({name})", broadcast_state

    def parameters_without_state():
        # Horovod's test_broadcast_state_no_grad: a frozen integer parameter and a fresh optimizer. After the
        # broadcast every parameter that requires grad has a (zero) gradient, which Horovod code broadcasts.
        a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        b = torch.nn.Parameter(torch.rand(4, generator=torch.Generator().manual_seed(rank)))
        optimizer = torch.optim.SGD([a, b], lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=[("a", a), ("b", b)])
        hvd.broadcast_parameters([a, b], root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        assert a.grad is None
        assert torch.equal(b.grad, torch.zeros(4)) and torch.equal(hvd.broadcast(b.grad, root_rank=0), b.grad)
        # b after the initialising step on zero gradients (its weight decay), as in one process.
        want = torch.nn.Parameter(torch.rand(4, generator=torch.Generator().manual_seed(0)))
        horovod_initialization(torch.optim.SGD([want], lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True))
        assert torch.equal(b.detach(), want.detach())

        # State for some parameters only, and a different set on each rank: the root's wins everywhere.
        model = make_model(seed=rank)
        head = torch.nn.Linear(3, 2).double()
        adam = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=0.01)
        x, y = data(rank, 4)
        loss = loss_of(model, x, y) + (head(y).sum() if rank != 0 else 0)  # the root never uses the head
        loss.backward()
        adam.step()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_parameters(head.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(adam, root_rank=0)
        assert len(adam.state) == len(list(model.parameters())), len(adam.state)
        identical_after_broadcast(model, adam)

    yield "broadcast_optimizer_state with parameters that have no gradient or state", parameters_without_state

    def fresh_optimizer_as_horovod():
        # Horovod 0.28.1 creates a fresh optimizer's state with one step on zero gradients (replacing any
        # gradients already there): Adam's step count is then 1, and weight decay has moved the parameters.
        for distributed in (False, True):
            model = make_model(seed=rank)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
            if distributed:
                optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            else:
                loss_of(model, *data(rank, 4)).backward()  # gradients that the initialisation replaces
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            want = make_model(seed=0)
            want_optimizer = torch.optim.Adam(want.parameters(), lr=0.01, weight_decay=0.1)
            horovod_initialization(want_optimizer)
            initial = make_model(seed=0).parameters()
            for got, expected, before in zip(model.parameters(), want.parameters(), initial, strict=True):
                assert not torch.equal(got, before)  # weight decay moved it
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
                assert torch.equal(got.grad, torch.zeros_like(got))
            for state, expected in zip(optimizer.state.values(), want_optimizer.state.values(), strict=True):
                assert float(state["step"]) == float(expected["step"]) == 1.0, (state["step"], expected["step"])
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(state[key], expected[key], rtol=0, atol=0)
            assert len(optimizer.state) == len(want_optimizer.state) == len(list(model.parameters()))
            identical_after_broadcast(model, optimizer)

        # SparseAdam, whose zero gradients are sparse and whose step count is a Python number.
        torch.manual_seed(rank)
        table = torch.nn.Embedding(6, 2, sparse=True).double()
        sparse = hvd.DistributedOptimizer(torch.optim.SparseAdam(table.parameters(), lr=0.05),
                                          named_parameters=table.named_parameters())  # fmt: skip
        hvd.broadcast_optimizer_state(sparse, root_rank=0)
        want_table = torch.nn.Embedding(6, 2, sparse=True).double()
        want_sparse = torch.optim.SparseAdam(want_table.parameters(), lr=0.05)
        horovod_initialization(want_sparse)
        assert table.weight.grad.is_sparse
        assert sparse.state_dict()["state"][0]["step"] == want_sparse.state_dict()["state"][0]["step"] == 1

    yield "broadcast_optimizer_state on a fresh optimizer == Horovod's steps in one process", fresh_optimizer_as_horovod

    def stateless_and_refused():
        # An optimizer that keeps no state even after the initialising step: Horovod sends nothing, so each
        # rank keeps its own learning rate.
        p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        sgd = torch.optim.SGD([p], lr=0.1 * (rank + 1))
        hvd.broadcast_optimizer_state(sgd, root_rank=0)
        assert sgd.param_groups[0]["lr"] == 0.1 * (rank + 1) and not sgd.state
        assert torch.equal(p.grad, torch.zeros(3, dtype=torch.float64)) and torch.equal(p.detach(), torch.ones(3))
        # LBFGS is refused, as in Horovod, before anything is sent.
        lbfgs = torch.optim.LBFGS([p], lr=0.1)
        try:
            hvd.broadcast_optimizer_state(lbfgs, root_rank=0)
        except ValueError as exc:
            assert "refuses torch.optim.LBFGS" in str(exc) and "broadcast_object" in str(exc), exc
        else:
            raise AssertionError("LBFGS was accepted")
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [size] * 2  # the job goes on

    yield "broadcast_optimizer_state: a stateless optimizer keeps its options; LBFGS is refused", stateless_and_refused

    def named_parameters_broadcast():
        model = make_model(seed=rank)
        hvd.broadcast_parameters(model.named_parameters(), root_rank=size - 1)
        want = make_model(seed=size - 1)
        for got, expected in zip(model.parameters(), want.parameters(), strict=True):
            assert torch.equal(got, expected)

    yield "broadcast_parameters(named_parameters())", named_parameters_broadcast


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(run_cases(cases))
