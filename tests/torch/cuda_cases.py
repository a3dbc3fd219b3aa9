"""Worker script: CUDA tensors through hora.torch (staged through pinned host memory); needs a GPU."""

from __future__ import annotations

import sys

import hora.torch as hvd
import torch

from tests.worker import run_cases


def cases(rank: int, size: int):
    device = torch.device("cuda", 0)

    def allreduce_in_place_and_out():
        x = torch.full((1000,), float(rank + 1), device=device)
        y = hvd.allreduce(x, op=hvd.Sum)
        assert y.device == device and torch.all(y == size * (size + 1) / 2)
        hvd.allreduce_(x, op=hvd.Average)
        assert x.device == device and torch.allclose(x, torch.tensor((size + 1) / 2, device=device))

    yield "allreduce on CUDA", allreduce_in_place_and_out

    def gather_broadcast_grad():
        x = torch.ones(rank + 1, 2, device=device, requires_grad=True)
        y = hvd.allgather(x)
        assert y.device == device and y.shape == (size * (size + 1) // 2, 2)
        y.sum().backward()
        assert x.grad.device == device and torch.all(x.grad == 1)
        b = torch.full((3,), float(rank), device=device)
        hvd.broadcast_(b, root_rank=size - 1)
        assert torch.all(b == size - 1)

    yield "allgather, broadcast and gradients on CUDA", gather_broadcast_grad

    def optimizer_on_cuda():
        torch.manual_seed(rank)
        model = torch.nn.Linear(4, 2).to(device)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())  # fmt: skip
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        model(torch.ones(3, 4, device=device) * (rank + 1)).sum().backward()
        optimizer.step()
        gathered = hvd.allgather_object([p.detach().cpu() for p in model.parameters()])
        assert all(torch.equal(a, b) for other in gathered for a, b in zip(other, gathered[0], strict=True))

    yield "DistributedOptimizer on CUDA", optimizer_on_cuda


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(run_cases(cases))
