"""Batch normalisation with statistics over the whole global batch, not each rank's slice.

In training, every rank sums its per-channel values, squares and row count;
one allreduce of those three vectors gives every rank the global mean and
variance, so the normalisation (and the running statistics) are what one
process would compute on the concatenated batch. The backward pass needs
two more global sums per channel, of the output gradient and of the output
gradient times the normalised input, and takes one more allreduce. The
gradients of ``weight`` and ``bias`` stay local sums, averaged across ranks
by the optimizer like any other gradient (as in torch's SyncBatchNorm). In
evaluation, or with one rank, it is plain batch normalisation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from hora.ops import Sum
from hora.process_sets import ProcessSet, global_process_set
from hora.torch.collectives import allreduce_

__all__ = ["SyncBatchNorm"]


def _channel_view(vector: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over ``like`` (channels in dimension 1)."""
    return vector.reshape([1, -1] + [1] * (like.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float, momentum: float,
                process_set: ProcessSet) -> torch.Tensor:  # fmt: skip
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        x = input.double()
        rows = torch.tensor([input.numel() // max(channels, 1)], dtype=torch.float64)
        stats = allreduce_(torch.cat([x.sum(dims), (x * x).sum(dims), rows]), op=Sum, process_set=process_set)
        count = stats[-1]
        if count.item() <= 1:
            raise ValueError(
                f"SyncBatchNorm needs more than one value per channel across all ranks to train, got {int(count)} "
                f"(input shape on this rank: {tuple(input.shape)})."
            )
        mean = stats[:channels] / count
        var = (stats[channels : 2 * channels] / count - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * (count / (count - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        xhat = ((x - _channel_view(mean, x)) * _channel_view(invstd, x)).to(input.dtype)
        output = xhat
        if weight is not None:
            output = output * _channel_view(weight, xhat)
        if bias is not None:
            output = output + _channel_view(bias, xhat)
        ctx.save_for_backward(xhat, invstd.to(input.dtype), weight, count)
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        xhat, invstd, weight, count = ctx.saved_tensors
        channels = xhat.shape[1]
        dims = [0, *range(2, xhat.dim())]
        sum_dy = grad_output.sum(dims)
        sum_dy_xhat = (grad_output * xhat).sum(dims)
        sums = allreduce_(torch.cat([sum_dy, sum_dy_xhat]).double(), op=Sum, process_set=ctx.process_set)
        mean_dy = (sums[:channels] / count).to(grad_output.dtype)
        mean_dy_xhat = (sums[channels:] / count).to(grad_output.dtype)
        scale = invstd if weight is None else invstd * weight
        grad_input = (
            grad_output - _channel_view(mean_dy, xhat) - xhat * _channel_view(mean_dy_xhat, xhat)
        ) * _channel_view(scale, xhat)
        grad_weight = sum_dy_xhat if weight is not None else None
        grad_bias = sum_dy if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalisation over the global batch of ``process_set``'s ranks; a drop-in for ``BatchNorm1d/2d/3d``.

    Args:
        num_features: channels (dimension 1 of the input).
        eps, momentum, affine, track_running_stats: as in ``torch.nn.BatchNorm2d``.
        process_set: the ranks whose batches are normalised together (default: all).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: ProcessSet = global_process_set) -> None:  # fmt: skip
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects input of at least 2 dimensions (N, C, ...), got {input.dim()}.")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        if not (batch_stats and self.training and self.process_set.size() > 1):
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, batch_stats, factor, self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, self.process_set
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: ProcessSet = global_process_set) -> torch.nn.Module:  # fmt: skip
        """Returns ``module`` with every ``BatchNorm*d`` layer replaced by a SyncBatchNorm holding its state."""
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)  # fmt: skip
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
            return converted
        for name, child in module.named_children():
            module.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return module
