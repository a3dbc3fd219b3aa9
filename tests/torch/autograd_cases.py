"""Worker script: gradients of the differentiable collectives and of SyncBatchNorm, against references.

Each rank weights its output with its own seeded tensor ``w_r`` and calls
backward on ``sum(output * w_r)``; the expected gradient is written out by
hand from every rank's ``w`` (computed on each rank from the seeds), as
Horovod defines it. SyncBatchNorm is compared with one process's
``BatchNorm1d`` on the concatenated batch.
"""

from __future__ import annotations

import sys

import hora.torch as hvd
import torch

from tests.worker import run_cases


def weights(shape: tuple[int, ...], rank: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def cases(rank: int, size: int):
    def allreduce_grad():
        for op in (hvd.Sum, hvd.Average):
            x = torch.full((4,), float(rank), dtype=torch.float64, requires_grad=True)
            y = hvd.allreduce(x, op=op, prescale_factor=2.0)
            (y * weights((4,), rank)).sum().backward()
            total = sum(weights((4,), r) for r in range(size)) * 2.0
            expected = total if op == hvd.Sum else total / size
            torch.testing.assert_close(x.grad, expected)

    yield "allreduce gradient (Sum, Average)", allreduce_grad

    def allgather_grad():
        for rows_of in (lambda r: 2, lambda r: r + 1):  # even (reducescatter path) and uneven
            rows = [rows_of(r) for r in range(size)]
            x = torch.zeros(rows[rank], 3, dtype=torch.float64, requires_grad=True)
            y = hvd.allgather(x)
            (y * weights(tuple(y.shape), rank)).sum().backward()
            mean = sum(weights(tuple(y.shape), r) for r in range(size)) / size
            start = sum(rows[:rank])
            torch.testing.assert_close(x.grad, mean[start : start + rows[rank]])

    yield "allgather gradient (even and uneven)", allgather_grad

    def broadcast_grad():
        x = torch.zeros(5, dtype=torch.float64, requires_grad=True)
        y = hvd.broadcast(x, root_rank=1)
        (y * weights((5,), rank)).sum().backward()
        mean = sum(weights((5,), r) for r in range(size)) / size
        torch.testing.assert_close(x.grad, mean if rank == 1 else torch.zeros(5, dtype=torch.float64))

    yield "broadcast gradient", broadcast_grad

    def alltoall_grad():
        splits = [[(r + p) % 3 + 1 for p in range(size)] for r in range(size)]
        x = torch.zeros(sum(splits[rank]), 2, dtype=torch.float64, requires_grad=True)
        y, received = hvd.alltoall(x, splits=splits[rank])
        assert received.tolist() == [splits[p][rank] for p in range(size)]
        (y * weights(tuple(y.shape), rank)).sum().backward()
        # Row block p of x went to rank p, landing at offset sum(splits[q][p] for q < rank) there.
        pieces = []
        for p in range(size):
            w = weights((sum(splits[q][p] for q in range(size)), 2), p)
            start = sum(splits[q][p] for q in range(rank))
            pieces.append(w[start : start + splits[rank][p]])
        torch.testing.assert_close(x.grad, torch.cat(pieces))

    yield "alltoall gradient", alltoall_grad

    def reducescatter_grad():
        # Horovod's convention: size times the adjoint (the adjoint computed here with plain torch on the
        # whole set of inputs), as for allreduce, whose Sum gradient is the sum of every rank's.
        rows = size + 1  # uneven: the first rank gets two rows
        for op, grouped, pre, post in [(hvd.Sum, False, 1.0, 1.0), (hvd.Average, False, 1.0, 1.0),
                                       (hvd.Sum, True, 2.0, 0.5), (hvd.Average, True, 3.0, 1.0)]:  # fmt: skip
            x = torch.zeros(rows, 3, dtype=torch.float64, requires_grad=True)
            if grouped:
                y, z = hvd.grouped_reducescatter([x, x * 2], op=op, prescale_factor=pre, postscale_factor=post)
                y = y + z / 2
            else:
                y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
            (y * weights(tuple(y.shape), rank)).sum().backward()

            everyone = torch.zeros(size, rows, 3, dtype=torch.float64, requires_grad=True)
            reduced = everyone.sum(0) * pre * post / (size if op == hvd.Average else 1)
            if grouped:
                reduced = 2 * reduced
            slices = torch.split(reduced, [2] + [1] * (size - 1))
            sum((s * weights(tuple(s.shape), r)).sum() for r, s in enumerate(slices)).backward()
            torch.testing.assert_close(x.grad, everyone.grad[rank] * size)

    yield "reducescatter gradient as Horovod (Sum, Average, grouped, scaled)", reducescatter_grad

    def grouped_allreduce_grad():
        xs = [torch.ones(n, dtype=torch.float64, requires_grad=True) for n in (2, 3)]
        ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
        sum((y * weights(tuple(y.shape), rank)).sum() for y in ys).backward()
        for x in xs:
            torch.testing.assert_close(x.grad, sum(weights(tuple(x.shape), r) for r in range(size)))

    yield "grouped allreduce gradient", grouped_allreduce_grad

    def in_place_saved_for_backward():
        # torch raises when a tensor saved for backward was modified in place; Hora's writes must count too.
        for label, write in [
            ("allreduce_", lambda t: hvd.allreduce_(t, op=hvd.Sum)),
            ("allreduce_async_", lambda t: hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Sum))),
            ("grouped_allreduce_", lambda t: hvd.grouped_allreduce_([t], op=hvd.Sum)),
            ("grouped_allreduce_async_", lambda t: hvd.synchronize(hvd.grouped_allreduce_async_([t], op=hvd.Sum))),
            ("broadcast_", lambda t: hvd.broadcast_(t, root_rank=0)),
            ("broadcast_async_", lambda t: hvd.synchronize(hvd.broadcast_async_(t, root_rank=0))),
        ]:
            for tracked in (False, True):  # a plain tensor, and a non-leaf in autograd's graph
                w = torch.full((3,), 2.0, dtype=torch.float64, requires_grad=True)
                x = torch.ones(3, dtype=torch.float64, requires_grad=tracked) * 1.0
                loss = (w * x).sum() if not tracked else (x * x).sum()  # saves x for backward
                before = x._version
                write(x)
                assert x._version > before, (label, tracked, before, x._version)
                try:
                    loss.backward()
                except RuntimeError as exc:
                    assert "modified by an inplace operation" in str(exc), (label, exc)
                else:
                    raise AssertionError(f"{label}: backward used values overwritten in place (grad {w.grad})")

    yield "in-place writes bump the version: a saved tensor raises in backward", in_place_saved_for_backward

    def in_place_on_leaf():
        leaf = torch.ones(3, requires_grad=True)
        for label, write in [
            ("allreduce_", lambda t: hvd.allreduce_(t)),
            ("allreduce_async_", lambda t: hvd.allreduce_async_(t)),
            ("grouped_allreduce_", lambda t: hvd.grouped_allreduce_([torch.ones(2), t])),
            ("grouped_allreduce_async_", lambda t: hvd.grouped_allreduce_async_([t])),
            ("broadcast_", lambda t: hvd.broadcast_(t, root_rank=0)),
            ("broadcast_async_", lambda t: hvd.broadcast_async_(t, root_rank=0)),
        ]:
            for target, message in [(leaf, "a leaf Variable"), (leaf[:2], "a view of a leaf Variable")]:
                try:
                    write(target)
                except RuntimeError as exc:
                    assert f"{message} that requires grad is being used in an in-place operation." in str(exc), exc
                else:
                    raise AssertionError(f"{label} wrote into a leaf that requires grad")
        assert leaf.tolist() == [1.0] * 3

        # Under no_grad, as broadcast_parameters runs, parameters are written (and their version moves).
        parameter = torch.nn.Parameter(torch.full((2,), float(rank)))
        before = parameter._version
        with torch.no_grad():
            hvd.broadcast_(parameter, root_rank=size - 1)
            hvd.allreduce_(parameter, op=hvd.Sum)
        assert parameter.tolist() == [float((size - 1) * size)] * 2 and parameter._version > before
        assert parameter.requires_grad and parameter.is_leaf and parameter.grad_fn is None

    yield "in-place ops refuse a leaf that requires grad; work under no_grad", in_place_on_leaf

    def in_place_gradient():
        # A non-leaf in autograd's graph: the in-place op carries the collective's gradient, as torch's own do.
        a = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
        x = a * 2
        hvd.allreduce_(x, op=hvd.Sum, prescale_factor=0.5)
        assert x.tolist() == [float(sum(range(1, size + 1)))] * 3
        (x * weights((3,), rank)).sum().backward()
        torch.testing.assert_close(a.grad, sum(weights((3,), r) for r in range(size)) * 0.5 * 2)

        b = torch.full((2,), float(rank), dtype=torch.float64, requires_grad=True)
        y = b * 1
        hvd.broadcast_(y, root_rank=0)
        (y * weights((2,), rank)).sum().backward()
        mean = sum(weights((2,), r) for r in range(size)) / size
        torch.testing.assert_close(b.grad, mean if rank == 0 else torch.zeros(2, dtype=torch.float64))

    yield "in-place allreduce_ and broadcast_ on a tracked tensor are differentiable", in_place_gradient

    def no_gradient_for_max():
        x = torch.ones(2, requires_grad=True)
        y = hvd.allreduce(x, op=hvd.Max)
        try:
            y.sum().backward()
        except RuntimeError as exc:
            assert "only Sum and Average are differentiable" in str(exc), exc
        else:
            raise AssertionError("backward through a Max allreduce did not raise")

    yield "no gradient through Max", no_gradient_for_max

    def sync_batch_norm():
        rows = [r + 3 for r in range(size)]  # uneven per-rank batches
        full = torch.randn(sum(rows), 4, 5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        upstream = torch.randn(sum(rows), 4, 5, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
        start = sum(rows[:rank])
        mine = slice(start, start + rows[rank])

        reference = torch.nn.BatchNorm1d(4, momentum=0.3).double()
        with torch.no_grad():
            reference.weight.copy_(torch.linspace(0.5, 2, 4))
            reference.bias.copy_(torch.linspace(-1, 1, 4))
        synced = hvd.SyncBatchNorm(4, momentum=0.3).double()
        synced.load_state_dict(reference.state_dict())

        x_ref = full.clone().requires_grad_()
        y_ref = reference(x_ref)
        (y_ref * upstream).sum().backward()

        x = full[mine].clone().requires_grad_()
        y = synced(x)
        (y * upstream[mine]).sum().backward()
        torch.testing.assert_close(y, y_ref[mine].detach())
        torch.testing.assert_close(x.grad, x_ref.grad[mine])
        torch.testing.assert_close(synced.running_mean, reference.running_mean)
        torch.testing.assert_close(synced.running_var, reference.running_var)
        # weight and bias gradients are local sums; across ranks they add up to the reference's.
        torch.testing.assert_close(hvd.allreduce(synced.weight.grad, op=hvd.Sum), reference.weight.grad)
        torch.testing.assert_close(hvd.allreduce(synced.bias.grad, op=hvd.Sum), reference.bias.grad)
        synced.eval()
        reference.eval()
        torch.testing.assert_close(synced(full[mine]), reference(full[mine]))

    yield "SyncBatchNorm against BatchNorm1d on the whole batch", sync_batch_norm

    def convert_sync_batchnorm():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
        with torch.no_grad():
            model[1].running_mean.copy_(torch.tensor([0.5, -0.5]))
            model[1].running_var.copy_(torch.tensor([2.0, 0.5]))
            model[1].weight.copy_(torch.tensor([1.5, 0.5]))
        x = torch.randn(2, 1, 5, 5)
        expected = model.eval()(x)
        converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
        assert isinstance(converted[1], hvd.SyncBatchNorm)
        torch.testing.assert_close(converted.eval()(x), expected)  # same parameters and running statistics

    yield "convert_sync_batchnorm", convert_sync_batchnorm


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(run_cases(cases))
