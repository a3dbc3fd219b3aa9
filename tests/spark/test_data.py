"""DataFrames to Parquet and back as each rank's batches, on local Spark and through hora.spark.run."""

from __future__ import annotations

import itertools
import warnings

import hora
import hora.spark
import numpy as np
import pytest
import torch
from hora.spark import ShardReader, Store, make_spark_converter, write_parquet

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def frame(spark):
    """10,000 rows in uneven partitions: an id, a float, a dense vector, a sparse vector and an array."""
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import Row

    rows = [
        Row(id=i, y=float(i) / 2, dense=Vectors.dense([i, 2.0 * i]), sparse=Vectors.sparse(3, {i % 3: 1.0}),
            arr=[i, i + 1, i + 2])
        for i in range(10_000)
    ]  # fmt: skip
    weights = [0.7, 0.2, 0.1]  # uneven partitions
    parts = spark.createDataFrame(rows).randomSplit(weights, seed=3)
    frame = parts[0].union(parts[1]).union(parts[2])
    return frame


def test_write_parquet_converts_vectors_and_checks_columns(spark, frame, tmp_path) -> None:
    store = Store.create(str(tmp_path))
    rows = write_parquet(frame, store, store.train_data_path("t"), num_files=3)
    assert rows == 10_000
    reader = ShardReader(store, store.train_data_path("t"), rank=0, size=1, batch_size=10_000)
    (batch,) = list(reader.numpy_batches())
    order = np.argsort(batch["id"])
    ids = batch["id"][order]
    assert ids.tolist() == list(range(10_000))
    np.testing.assert_array_equal(batch["dense"][order], np.stack([ids, 2.0 * ids], axis=1).astype(np.float32))
    np.testing.assert_array_equal(batch["sparse"][order].argmax(axis=1), ids % 3)
    np.testing.assert_array_equal(batch["arr"][order], np.stack([ids, ids + 1, ids + 2], axis=1))
    assert batch["dense"].dtype == np.float32 and batch["y"].dtype == np.float64

    with pytest.raises(ValueError, match=r"The column 'nope' is not in the DataFrame; its columns are \['arr',"):
        write_parquet(frame, store, store.val_data_path("t"), columns=["id", "nope"])
    with pytest.raises(ValueError, match=r"The column 'name' has type string; expected a number"):
        write_parquet(frame.selectExpr("id", "cast(id as string) as name"), store, store.val_data_path("t"))


def _read_shard(path: str, batch_size: int, shuffle: int) -> dict:
    reader = ShardReader(None, path, batch_size=batch_size, shuffle_buffer_size=shuffle, seed=5)
    epochs = [[b["id"].tolist() for b in reader.numpy_batches(epoch)] for epoch in range(2)]
    steps = hora.allgather(np.array([len(reader)])).tolist()
    for ids in epochs[0]:  # every rank steps together: a real allreduce per batch
        hora.allreduce(np.array([float(len(ids))]), op=hora.Sum)
    return {"rank": hora.rank(), "epochs": epochs, "steps": steps}


@pytest.mark.parametrize("shuffle", [0, 300])
def test_two_ranks_cover_every_row_once_per_epoch_in_equal_steps(spark, frame, tmp_path, shuffle) -> None:
    store = Store.create(str(tmp_path))
    path = store.train_data_path("cover")
    write_parquet(frame.select("id"), store, path, num_files=3)
    results = hora.spark.run(_read_shard, args=(path, 64, shuffle), num_proc=2, spark=spark, verbose=0)
    for epoch in range(2):
        per_rank = [list(itertools.chain(*r["epochs"][epoch])) for r in results]
        assert not set(per_rank[0]) & set(per_rank[1])  # disjoint
        assert sorted(per_rank[0] + per_rank[1]) == list(range(10_000))  # every row once
        assert all(1 <= len(batch) <= 64 for r in results for batch in r["epochs"][epoch])
    assert results[0]["steps"] == results[1]["steps"] == [79, 79]
    if shuffle:
        assert results[0]["epochs"][0] != results[0]["epochs"][1]  # each epoch reads another order
        first_epoch = list(itertools.chain(*results[0]["epochs"][0]))
        assert first_epoch != sorted(first_epoch)


def test_converter_round_trip_is_cached_by_plan(spark, frame, tmp_path) -> None:
    converter = make_spark_converter(frame, store=str(tmp_path))
    assert len(converter) == 10_000
    again = make_spark_converter(frame, store=str(tmp_path))
    assert again.path == converter.path  # the same plan: not written twice
    other = make_spark_converter(frame.where("id < 100"), store=str(tmp_path))
    assert other.path != converter.path and len(other) == 100

    seen = []
    for shard in range(2):
        with converter.make_torch_dataloader(batch_size=128, num_epochs=1, cur_shard=shard, shard_count=2) as loader:
            batches = list(loader)
            assert len(batches) == len(loader) == 40
            assert list(loader) == []  # one epoch only
        first = batches[0]
        assert set(first) == {"id", "y", "dense", "sparse", "arr"}
        assert first["dense"].dtype == torch.float32 and first["dense"].shape[1] == 2
        torch.testing.assert_close(first["dense"][:, 1], 2 * first["id"].float())
        seen += torch.cat([b["id"] for b in batches]).tolist()
    assert sorted(seen) == list(range(10_000))
    other.delete()
    assert not Store.create(str(tmp_path)).exists(other.path)


def test_tf_dataset(spark, frame, tmp_path) -> None:
    pytest.importorskip("tensorflow", reason="needs tensorflow: pip install 'hora[tensorflow]'")
    converter = make_spark_converter(frame.select("id", "dense"), store=str(tmp_path))
    with converter.make_tf_dataset(batch_size=1000, cur_shard=0, shard_count=1) as dataset:
        batches = list(dataset.as_numpy_iterator())
    assert len(batches) == 10 and sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(10_000))


def test_petastorm_reader_over_the_same_files(spark, frame, tmp_path) -> None:
    pytest.importorskip("petastorm", reason="petastorm installs only beside pyarrow<15 (the legacy Spark 3.5 stack)")
    converter = make_spark_converter(frame.select("id", "dense"), store=str(tmp_path))
    seen = []
    for shard in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # petastorm 0.12 uses pyarrow's deprecated filesystems
            with converter.make_petastorm_reader(num_epochs=1, cur_shard=shard, shard_count=2, workers_count=1) as r:
                for batch in r:
                    np.testing.assert_array_equal(np.stack(batch.dense)[:, 1], 2.0 * batch.id)
                    seen += batch.id.tolist()
    assert sorted(seen) == list(range(10_000))
