"""Each rank's shard of a Parquet dataset, as Arrow record batches or framework batches.

Sharding: the dataset's rows, in file and row-group order, are cut into
``size`` contiguous ranges whose lengths differ by at most one, and rank r
reads range r (with ``shuffle``, range ``(r + epoch) % size``, so each rank
sees other rows every epoch). Every row is read by exactly one rank per
epoch. A rank reads only the row groups that overlap its range, from the
Parquet footers it knows which.

Equal steps: no rank may wait in an allreduce that another rank will not
join, so every rank takes the same number of steps per epoch, computed from
the footers alone (no communication): ``steps = min(ceil(largest shard /
batch_size), smallest shard)``. Each rank splits its shard into ``steps``
batches whose sizes differ by at most one, so no row is dropped or repeated
and no batch is larger than ``batch_size`` (but for the corner case of
``batch_size`` 1 with uneven shards).

Shuffling: the shard's row groups are read in a seeded random order, and
rows pass through a shuffle buffer of ``shuffle_buffer_size`` rows that
emits a random half of itself each time it fills. The seed combines
``seed``, the epoch and the shard, so runs repeat exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hora.spark.store import Store

__all__ = ["ShardReader"]


@dataclass(frozen=True)
class _RowGroup:
    path: str
    index: int
    start: int  # first row's position in the whole dataset
    rows: int


class ShardReader:
    """Reads one rank's shard of the Parquet dataset at ``path`` in ``store``.

    Args:
        store: where the dataset is (see :class:`hora.spark.Store`); or None
            with ``path`` a local directory.
        path: the dataset's directory.
        rank: this rank (default: ``hora.rank()``).
        size: the number of ranks (default: ``hora.size()``).
        batch_size: the largest number of rows in a batch.
        columns: the columns to read (default: all).
        shuffle_buffer_size: rows in the shuffle buffer; 0 reads rows in order
            (and every epoch reads the same shard).
        seed: the shuffling seed; the same seed gives the same batches.
    """

    def __init__(
        self, store: Store | None, path: str, *, rank: int | None = None, size: int | None = None,
        batch_size: int = 32, columns: Sequence[str] | None = None, shuffle_buffer_size: int = 0, seed: int = 0,
    ) -> None:  # fmt: skip
        import pyarrow.parquet as pq

        if rank is None or size is None:
            import hora

            rank, size = hora.rank(), hora.size()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if shuffle_buffer_size < 0:
            raise ValueError(f"shuffle_buffer_size must be >= 0, got {shuffle_buffer_size!r}.")
        if not 0 <= rank < size:
            raise ValueError(f"rank={rank} is not in 0..{size - 1}.")
        self._store = store if store is not None else Store.create(path)
        self._filesystem = self._store.arrow_filesystem()
        self.rank, self.size, self.batch_size = rank, size, batch_size
        self.columns = list(columns) if columns is not None else None
        self.shuffle_buffer_size, self.seed = shuffle_buffer_size, seed
        root = self._store.arrow_path(path)
        files = sorted(
            info.path
            for info in self._filesystem.get_file_info(_selector(root))
            if info.is_file and not info.base_name.startswith(("_", ".")) and info.base_name.endswith(".parquet")
        )
        self._groups: list[_RowGroup] = []
        start = 0
        for file in files:
            metadata = pq.ParquetFile(file, filesystem=self._filesystem).metadata
            for index in range(metadata.num_row_groups):
                rows = metadata.row_group(index).num_rows
                if rows:
                    self._groups.append(_RowGroup(file, index, start, rows))
                    start += rows
        self.num_rows = start
        if self.num_rows < size:
            raise ValueError(
                f"The dataset at {path} has {self.num_rows} rows, fewer than the {size} ranks that share it; "
                "every rank needs at least one row."
            )
        smallest, largest = self.num_rows // size, math.ceil(self.num_rows / size)
        self.steps_per_epoch = min(math.ceil(largest / batch_size), smallest)
        self.schema = pq.ParquetFile(files[0], filesystem=self._filesystem).schema_arrow

    def __len__(self) -> int:
        return self.steps_per_epoch

    def shard_range(self, epoch: int = 0) -> tuple[int, int]:
        """The ``[start, stop)`` rows of the dataset this rank reads in ``epoch``."""
        shard = (self.rank + epoch) % self.size if self.shuffle_buffer_size else self.rank
        return shard * self.num_rows // self.size, (shard + 1) * self.num_rows // self.size

    def batch_sizes(self, epoch: int = 0) -> list[int]:
        """The size of each of this epoch's ``steps_per_epoch`` batches."""
        start, stop = self.shard_range(epoch)
        base, extra = divmod(stop - start, self.steps_per_epoch)
        return [base + 1] * extra + [base] * (self.steps_per_epoch - extra)

    # --- Arrow ------------------------------------------------------------------------------

    def arrow_batches(self, epoch: int = 0) -> Iterator[Any]:
        """This rank's batches of ``epoch`` as ``pyarrow.RecordBatch``es (exactly ``steps_per_epoch`` of them)."""
        import pyarrow as pa

        sizes = self.batch_sizes(epoch)
        pending: list[Any] = []
        have = 0
        step = 0
        for table in self._shuffled_rows(epoch):
            pending.append(table)
            have += table.num_rows
            while step < len(sizes) and have >= sizes[step]:
                merged = pa.concat_tables(pending)  # zero-copy: only the batch's own rows are copied below
                yield merged.slice(0, sizes[step]).combine_chunks().to_batches()[0]
                pending, have, step = [merged.slice(sizes[step])], have - sizes[step], step + 1
        if step != len(sizes):  # the plan and the data disagree: the files changed under us
            raise RuntimeError(f"Rank {self.rank} read fewer rows than its shard holds; did the dataset change?")

    def _row_groups(self, epoch: int) -> Iterator[Any]:
        """The shard's rows, row group by row group (sliced at the shard's edges), in a seeded order."""
        import pyarrow.parquet as pq

        start, stop = self.shard_range(epoch)
        groups = [g for g in self._groups if g.start < stop and g.start + g.rows > start]
        if self.shuffle_buffer_size:
            order = self._random(epoch, "groups").permutation(len(groups))
            groups = [groups[i] for i in order]
        for group in groups:
            table = pq.ParquetFile(group.path, filesystem=self._filesystem).read_row_group(
                group.index, columns=self.columns
            )
            lo, hi = max(start - group.start, 0), min(stop - group.start, group.rows)
            yield table.slice(lo, hi - lo)

    def _shuffled_rows(self, epoch: int) -> Iterator[Any]:
        import pyarrow as pa

        if not self.shuffle_buffer_size:
            yield from self._row_groups(epoch)
            return
        random = self._random(epoch, "rows")
        buffer: list[Any] = []
        held = 0
        for table in self._row_groups(epoch):
            buffer.append(table)
            held += table.num_rows
            if held >= self.shuffle_buffer_size:
                merged = pa.concat_tables(buffer).take(random.permutation(held))
                emit = held // 2 if held > 1 else held
                yield merged.slice(0, emit)
                buffer, held = [merged.slice(emit)], held - emit
        if held:
            yield pa.concat_tables(buffer).take(random.permutation(held))

    def _random(self, epoch: int, purpose: str) -> np.random.Generator:
        shard = self.shard_range(epoch)[0]
        return np.random.default_rng([self.seed, epoch, shard, 0 if purpose == "groups" else 1])

    # --- frameworks -------------------------------------------------------------------------

    def numpy_batches(self, epoch: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches as dicts of column name to numpy array (list columns become 2-D arrays)."""
        for batch in self.arrow_batches(epoch):
            yield {name: column_to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}

    def torch_loader(self, num_epochs: int | None = None) -> TorchLoader:
        """A ``DataLoader``-like iterable of dicts of tensors; each ``iter()`` is the next epoch."""
        return TorchLoader(self, num_epochs)

    def tf_dataset(self, num_epochs: int | None = 1) -> Any:
        """A ``tf.data.Dataset`` of dicts of tensors over ``num_epochs`` epochs (None: repeat forever)."""
        import tensorflow as tf

        signature = {
            field.name: tf.TensorSpec(shape=(None,) if _is_scalar(field.type) else (None, None),
                                      dtype=tf.as_dtype(_numpy_dtype(field.type)))
            for field in self.schema if self.columns is None or field.name in self.columns
        }  # fmt: skip

        def generate() -> Iterator[dict[str, np.ndarray]]:
            epoch = 0
            while num_epochs is None or epoch < num_epochs:
                yield from self.numpy_batches(epoch)
                epoch += 1

        return tf.data.Dataset.from_generator(generate, output_signature=signature)


class TorchLoader:
    """Iterating gives one epoch of this rank's batches as dicts of tensors; ``len()`` is the steps per epoch."""

    def __init__(self, reader: ShardReader, num_epochs: int | None) -> None:
        self._reader = reader
        self._num_epochs = num_epochs
        self.epoch = 0

    def __len__(self) -> int:
        return self._reader.steps_per_epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch

        if self._num_epochs is not None and self.epoch >= self._num_epochs:
            return
        epoch, self.epoch = self.epoch, self.epoch + 1
        for batch in self._reader.numpy_batches(epoch):
            yield {name: torch.from_numpy(values) for name, values in batch.items()}


def column_to_numpy(column: Any) -> np.ndarray:
    """An Arrow column as numpy: scalars 1-D, lists of equal length 2-D (one row per list)."""
    import pyarrow as pa

    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        rows = len(column)
        values = column.flatten().to_numpy(zero_copy_only=False)
        width = len(values) // rows if rows else 0
        if width * rows != len(values):
            raise ValueError("A list column holds lists of different lengths; every row must have the same length.")
        return np.require(values.reshape(rows, width), requirements="W")
    return np.require(column.to_numpy(zero_copy_only=False), requirements="W")  # Arrow's memory is read-only


def _is_scalar(arrow_type: Any) -> bool:
    import pyarrow as pa

    return not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type))


def _numpy_dtype(arrow_type: Any) -> np.dtype:
    value_type = arrow_type if _is_scalar(arrow_type) else arrow_type.value_type
    return np.dtype(value_type.to_pandas_dtype())


def _selector(root: str) -> Any:
    import pyarrow.fs

    return pyarrow.fs.FileSelector(root, recursive=False)
