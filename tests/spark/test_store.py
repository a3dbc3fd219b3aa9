"""Stores: each kind's layout, the paths Spark and the workers use, and file operations."""

from __future__ import annotations

import pytest
from hora.spark import DBFSStore, FsspecStore, LocalStore, Store, VolumeStore


def test_local_store_lays_out_each_run_and_does_file_operations(tmp_path) -> None:
    for prefix in (str(tmp_path), f"file://{tmp_path}"):
        store = Store.create(prefix)
        assert isinstance(store, LocalStore)
        assert store.train_data_path("r1") == f"{tmp_path}/runs/r1/train"
        assert store.val_data_path("r1") == f"{tmp_path}/runs/r1/val"
        assert store.checkpoint_path("r1") == f"{tmp_path}/runs/r1/checkpoints"
        assert store.logs_path("r1") == f"{tmp_path}/runs/r1/logs"
        assert store.spark_path(store.train_data_path("r1")) == f"file://{tmp_path}/runs/r1/train"
        path = store.join("runs", "r1", "checkpoints", "epoch-1.pt")
        store.write_bytes(path, b"weights")
        assert store.exists(path) and store.read_bytes(path) == b"weights"
        assert store.listdir(store.checkpoint_path("r1")) == ["epoch-1.pt"]
        store.delete(store.run_path("r1"))
        assert not store.exists(path) and store.listdir(store.checkpoint_path("r1")) == []


def test_dbfs_paths_map_between_spark_and_the_fuse_mount() -> None:
    for prefix in ("dbfs:/ml/hora", "/dbfs/ml/hora"):
        store = Store.create(prefix)
        assert isinstance(store, DBFSStore)
        assert store.train_data_path("a") == "/dbfs/ml/hora/runs/a/train"  # what workers read
        assert store.spark_path(store.train_data_path("a")) == "dbfs:/ml/hora/runs/a/train"  # what Spark writes


def test_volumes_use_one_path_for_spark_and_workers() -> None:
    store = Store.create("/Volumes/main/default/models")
    assert isinstance(store, VolumeStore)
    path = store.checkpoint_path("b")
    assert path == "/Volumes/main/default/models/runs/b/checkpoints" and store.spark_path(path) == path


def test_fsspec_urls_read_and_write_through_fsspec() -> None:
    store = Store.create("memory://hora-store-test")
    assert isinstance(store, FsspecStore)
    path = store.join("runs", "c", "logs", "events.txt")
    store.write_bytes(path, b"line\n")
    assert store.read_bytes(path) == b"line\n" and store.listdir(store.logs_path("c")) == ["events.txt"]
    info = store.arrow_filesystem().get_file_info(store.arrow_path(path))
    assert info.size == 5
    assert Store.create("s3://bucket/x").spark_path("s3://bucket/x/runs/a") == "s3a://bucket/x/runs/a"


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_prefixes_and_run_ids_are_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"Store\.create expects a non-empty path or URL"):
        Store.create(bad)
    with pytest.raises(ValueError, match="A run id must be a non-empty name without '/'"):
        Store.create("/tmp/x").run_path("a/b")


def test_importing_hora_spark_imports_no_framework_or_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, hora.spark; print([m for m in ('torch', 'tensorflow', 'pyspark', 'ray') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
