"""``make_spark_converter(df)``: a DataFrame materialised once as Parquet, read as torch or TensorFlow batches.

Like Petastorm's converter: the DataFrame is written to the store's cache
(``<prefix>/cache/<key>``) the first time and reused afterwards, the key
being a hash of the DataFrame's analyzed plan and schema, so converting the
same DataFrame again costs nothing. Reading goes through
:class:`hora.spark.shards.ShardReader` (or Petastorm's reader, when asked for
and installed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterator
from typing import Any

from hora.spark.dataframes import parquet_rows, write_parquet
from hora.spark.shards import ShardReader, TorchLoader
from hora.spark.store import Store

__all__ = ["SparkDatasetConverter", "make_spark_converter"]

_CACHE_CONF = "hora.spark.converter.cacheDir"  # also Petastorm's spark.conf key, below
_PETASTORM_CACHE_CONF = "petastorm.spark.converter.parentCacheDirUrl"


def _plan_key(df: Any) -> str:
    """A hash of the DataFrame's analyzed plan and schema: equal for the same query over the same sources."""
    try:
        plan = df._jdf.queryExecution().analyzed().toString()
    except Exception:  # Spark Connect: no JVM plan; its semantic hash serves
        plan = str(df.semanticHash())
    text = json.dumps([plan, df.schema.json()])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _default_store(spark: Any) -> Store:
    conf = spark.conf
    prefix = conf.get(_CACHE_CONF, None) or conf.get(_PETASTORM_CACHE_CONF, None)
    if prefix is None:
        prefix = tempfile.mkdtemp(prefix="hora-converter-")
        conf.set(_CACHE_CONF, prefix)
    return Store.create(prefix)


class SparkDatasetConverter:
    """A DataFrame materialised as Parquet in a store; make readers of it per rank.

    Attributes:
        path: the Parquet dataset's directory in the store.
        dataset_size: the number of rows.
    """

    def __init__(self, store: Store, path: str, dataset_size: int) -> None:
        self.store = store
        self.path = path
        self.dataset_size = dataset_size

    def __len__(self) -> int:
        return self.dataset_size

    def reader(self, batch_size: int = 32, cur_shard: int | None = None, shard_count: int | None = None,
               shuffle_buffer_size: int = 0, seed: int = 0) -> ShardReader:  # fmt: skip
        """This shard's :class:`ShardReader` (shard defaults: this Hora rank of ``hora.size()``)."""
        return ShardReader(self.store, self.path, rank=cur_shard, size=shard_count, batch_size=batch_size,
                           shuffle_buffer_size=shuffle_buffer_size, seed=seed)  # fmt: skip

    @contextlib.contextmanager
    def make_torch_dataloader(self, batch_size: int = 32, num_epochs: int | None = None,
                              cur_shard: int | None = None, shard_count: int | None = None,
                              shuffle_buffer_size: int = 0, seed: int = 0) -> Iterator[TorchLoader]:  # fmt: skip
        """A loader of dicts of tensors; each ``iter()`` is one epoch (``num_epochs`` of them; None: no limit)."""
        yield self.reader(batch_size, cur_shard, shard_count, shuffle_buffer_size, seed).torch_loader(num_epochs)

    @contextlib.contextmanager
    def make_tf_dataset(self, batch_size: int = 32, num_epochs: int | None = 1, cur_shard: int | None = None,
                        shard_count: int | None = None, shuffle_buffer_size: int = 0,
                        seed: int = 0) -> Iterator[Any]:  # fmt: skip
        """A ``tf.data.Dataset`` of dicts of tensors over ``num_epochs`` epochs (None: repeats forever)."""
        yield self.reader(batch_size, cur_shard, shard_count, shuffle_buffer_size, seed).tf_dataset(num_epochs)

    @contextlib.contextmanager
    def make_petastorm_reader(self, num_epochs: int | None = 1, cur_shard: int | None = None,
                              shard_count: int | None = None, **options: Any) -> Iterator[Any]:  # fmt: skip
        """Petastorm's ``make_batch_reader`` over the same files (needs petastorm: pyarrow < 15 stacks)."""
        try:
            from petastorm import make_batch_reader
        except ImportError as exc:
            raise ImportError(
                "make_petastorm_reader needs petastorm, which installs only beside pyarrow<15 (Spark 3.5 stacks); "
                "the default reader (make_torch_dataloader / reader) needs nothing more."
            ) from exc
        url = self.store.spark_path(self.path).replace("dbfs:/", "file:///dbfs/")
        with make_batch_reader(url, num_epochs=num_epochs, cur_shard=cur_shard, shard_count=shard_count,
                               **options) as reader:  # fmt: skip
            yield reader

    def delete(self) -> None:
        """Deletes the materialised data."""
        self.store.delete(self.path)
        _CONVERTED.pop(self.path, None)


_CONVERTED: dict[str, SparkDatasetConverter] = {}


def make_spark_converter(df: Any, store: Store | str | None = None, num_files: int = 8) -> SparkDatasetConverter:
    """Materialises ``df`` as Parquet in ``store`` (once per distinct DataFrame) and returns its converter.

    Args:
        df: the DataFrame; columns must be numbers, booleans, vectors or arrays of numbers.
        store: a Store or a path/URL for one (default: the ``hora.spark.converter.cacheDir``
            (or Petastorm's ``petastorm.spark.converter.parentCacheDirUrl``) Spark setting,
            else a new temporary directory).
        num_files: how many Parquet files to write.
    """
    if isinstance(store, str):
        store = Store.create(store)
    if store is None:
        store = _default_store(df.sparkSession)
    path = store.cache_path(_plan_key(df))
    if store.exists(path + "/_SUCCESS"):  # written before, by this process or an earlier one
        cached = _CONVERTED.get(path)
        return cached if cached is not None else SparkDatasetConverter(store, path, parquet_rows(store, path))
    rows = write_parquet(df, store, path, num_files=num_files)
    converter = SparkDatasetConverter(store, path, rows)
    _CONVERTED[path] = converter
    return converter
