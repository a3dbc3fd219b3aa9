"""A sampler that resumes mid-epoch after the job re-forms, on however many ranks it then has."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data
from hora import basics

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Shards a dataset across ranks and remembers how much of the epoch the job has processed, as Horovod's.

    Every rank orders the epoch's indices the same way (shuffled with seed
    ``seed + epoch``); rank r of n takes every n-th index of what remains,
    starting at r. So after k batches of b samples on n ranks the job has
    processed exactly the first ``k * b * n`` indices of the order: record
    each batch with :meth:`record_batch`, and after a reset (restored from the
    last commit, synced from rank 0, on a different number of ranks) the rest
    of the epoch is split among the new ranks, no sample seen twice and none
    skipped. The last round of an epoch is padded from its start so every
    rank gets as many samples, as ``DistributedSampler`` does.

    Use it with :class:`~hora.torch.elastic.TorchState`, which saves,
    restores and syncs it, and call :meth:`set_epoch` at the end of each epoch.

    Args:
        dataset: anything with a length.
        shuffle: shuffle the indices each epoch.
        seed: the shuffle's seed (plus the epoch).
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch``: a new order and nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records that every rank processed one more batch of ``batch_size`` samples (``batch_idx`` is unused)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        """The epoch and how many of its samples the job processed, for :meth:`load_state_dict`."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s position and splits the rest of the epoch among the current ranks."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Reads the job's rank and size again and splits what remains of the epoch among its ranks."""
        self.num_replicas = basics.size()
        self.rank = basics.rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        while len(indices) < self.total_size:  # pad from the start (more than once when few remain)
            indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
