"""Stores: where a run's Parquet data, checkpoints and logs live, seen from Spark and from the workers.

``Store.create(prefix)`` picks the kind from the prefix:

- a local path or ``file://`` URL: :class:`LocalStore`;
- ``dbfs:/...`` or ``/dbfs/...`` (Databricks File System): :class:`DBFSStore`; Spark writes
  ``dbfs:/x`` and workers read the same files through the ``/dbfs/x`` mount;
- ``/Volumes/...`` (Unity Catalog volumes): :class:`VolumeStore`;
- any other URL (``s3://``, ``gs://``, ``abfss://``, ``hdfs://``, ``memory://`` ...):
  :class:`FsspecStore`, through fsspec.

Every run id gets ``<prefix>/runs/<run_id>/`` with ``train/``, ``val/``,
``checkpoints/`` and ``logs/``; DataFrames materialised by the converter are
cached under ``<prefix>/cache/``.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

__all__ = ["DBFSStore", "FsspecStore", "LocalStore", "Store", "VolumeStore"]

_SPARK_SCHEMES = {"s3": "s3a"}  # Hadoop's connector for S3 is s3a


class Store:
    """Where a run's data, checkpoints and logs live. Create one with :meth:`Store.create`.

    Paths handed around are in the store's own form (a local path for local
    stores, a URL for fsspec ones); :meth:`spark_path` gives the form Spark
    reads and writes, :meth:`arrow_filesystem` the form workers read with.
    """

    def __init__(self, prefix_path: str) -> None:
        self.prefix_path = prefix_path.rstrip("/") or "/"

    @staticmethod
    def create(prefix_path: str) -> Store:
        """The store for ``prefix_path`` (see the module documentation for the kinds)."""
        if not isinstance(prefix_path, str) or not prefix_path:
            raise ValueError(f"Store.create expects a non-empty path or URL, got {prefix_path!r}.")
        if prefix_path.startswith(("dbfs:/", "/dbfs/")) or prefix_path in ("dbfs:", "/dbfs"):
            return DBFSStore(prefix_path)
        if prefix_path.startswith("/Volumes/"):
            return VolumeStore(prefix_path)
        if prefix_path.startswith("file://"):
            return LocalStore(prefix_path[len("file://") :])
        if "://" in prefix_path:
            return FsspecStore(prefix_path)
        return LocalStore(prefix_path)

    # --- layout ------------------------------------------------------------------------------

    def join(self, *parts: str) -> str:
        """``parts`` below the prefix."""
        return posixpath.join(self.prefix_path, *parts)

    def run_path(self, run_id: str) -> str:
        """Everything of run ``run_id``: ``<prefix>/runs/<run_id>``."""
        if not isinstance(run_id, str) or not run_id or "/" in run_id or run_id in (".", ".."):
            raise ValueError(f"A run id must be a non-empty name without '/', got {run_id!r}.")
        return self.join("runs", run_id)

    def train_data_path(self, run_id: str) -> str:
        """Where run ``run_id``'s training rows are written as Parquet."""
        return posixpath.join(self.run_path(run_id), "train")

    def val_data_path(self, run_id: str) -> str:
        """Where run ``run_id``'s validation rows are written as Parquet."""
        return posixpath.join(self.run_path(run_id), "val")

    def checkpoint_path(self, run_id: str) -> str:
        """Where rank 0 checkpoints run ``run_id`` after every epoch (fitting again resumes from it)."""
        return posixpath.join(self.run_path(run_id), "checkpoints")

    def logs_path(self, run_id: str) -> str:
        """Where run ``run_id``'s logs are written."""
        return posixpath.join(self.run_path(run_id), "logs")

    def cache_path(self, key: str) -> str:
        """Where a converted DataFrame is cached under ``key`` (``make_spark_converter``)."""
        return self.join("cache", key)

    # --- access ------------------------------------------------------------------------------

    def spark_path(self, path: str) -> str:
        """``path`` as Spark reads and writes it."""
        raise NotImplementedError

    def arrow_filesystem(self) -> Any:
        """A ``pyarrow.fs.FileSystem`` for the workers' reads."""
        raise NotImplementedError

    def arrow_path(self, path: str) -> str:
        """``path`` as :meth:`arrow_filesystem` names it."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether ``path`` (in the store's form) exists."""
        return bool(self._fs().exists(self.arrow_path(path)))

    def read_bytes(self, path: str) -> bytes:
        """The contents of the file at ``path`` (in the store's form)."""
        with self._fs().open(self.arrow_path(path), "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Writes ``data`` to ``path`` atomically where the file system allows (write, then rename)."""
        fs = self._fs()
        target = self.arrow_path(path)
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp-{os.getpid()}"
        with fs.open(temporary, "wb") as f:
            f.write(data)
        fs.mv(temporary, target)

    def listdir(self, path: str) -> list[str]:
        """The names directly under ``path`` (empty when it does not exist)."""
        fs = self._fs()
        target = self.arrow_path(path)
        if not fs.exists(target):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(target, detail=False))

    def delete(self, path: str) -> None:
        """Deletes ``path`` and everything under it, if it exists."""
        fs = self._fs()
        target = self.arrow_path(path)
        if fs.exists(target):
            fs.rm(target, recursive=True)

    def _fs(self) -> Any:
        """An fsspec file system for the store's own file operations."""
        import fsspec

        return fsspec.filesystem("file")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.prefix_path!r})"


class LocalStore(Store):
    """A directory on a file system every worker mounts at the same path (or the only machine)."""

    def __init__(self, prefix_path: str) -> None:
        super().__init__(os.path.abspath(os.path.expanduser(prefix_path)))

    def spark_path(self, path: str) -> str:
        return "file://" + path

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    def arrow_path(self, path: str) -> str:
        return path


class DBFSStore(LocalStore):
    """Databricks File System: Spark uses ``dbfs:/x``, workers the FUSE mount ``/dbfs/x``."""

    def __init__(self, prefix_path: str) -> None:
        if prefix_path.startswith("dbfs:"):
            prefix_path = "/dbfs/" + prefix_path[len("dbfs:") :].lstrip("/")
        Store.__init__(self, prefix_path)

    def spark_path(self, path: str) -> str:
        return "dbfs:/" + path[len("/dbfs") :].lstrip("/")


class VolumeStore(LocalStore):
    """A Unity Catalog volume: the same ``/Volumes/...`` path for Spark and for the workers."""

    def __init__(self, prefix_path: str) -> None:
        Store.__init__(self, prefix_path)

    def spark_path(self, path: str) -> str:
        return path


class FsspecStore(Store):
    """Any file system fsspec knows (object stores, HDFS, ...), by URL."""

    def __init__(self, prefix_path: str) -> None:
        super().__init__(prefix_path)
        self.protocol = prefix_path.split("://", 1)[0]

    def _fs(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.protocol)

    def spark_path(self, path: str) -> str:
        scheme, rest = path.split("://", 1)
        return f"{_SPARK_SCHEMES.get(scheme, scheme)}://{rest}"

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs

        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(self._fs()))

    def arrow_path(self, path: str) -> str:
        from fsspec.core import strip_protocol

        return strip_protocol(path)
