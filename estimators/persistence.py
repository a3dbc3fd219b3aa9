"""Saving and loading estimators and models whose Params hold Python objects (models, optimizers, losses).

Spark ML's metadata file (``DefaultParamsWriter.saveMetadata``) records the
class, uid and every Param that JSON can hold, so the directory is a normal
Spark ML one (a ``PipelineModel`` can hold it). All Params, and any extra
state such as a model's training history, are also cloudpickled together,
so shared objects stay shared (an optimizer still points at its model's
parameters), into a one-row Parquet file under ``data/``: Spark writes and
reads it, so any path Spark can use (local, DBFS, object stores) works.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import cloudpickle
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

__all__ = ["BlobReader", "BlobWriter"]


def _json_able(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class BlobWriter(MLWriter):
    """Writes ``instance``'s metadata, and its Params plus ``state(instance)`` as one blob (``dumps``: cloudpickle)."""

    def __init__(
        self,
        instance: Any,
        state: Callable[[Any], Any] | None = None,
        dumps: Callable[[Any], bytes] = cloudpickle.dumps,
    ) -> None:
        super().__init__()
        self.instance = instance
        self.state = state
        self.dumps = dumps

    def saveImpl(self, path: str) -> None:
        params = {p.name: v for p, v in self.instance._paramMap.items()}
        simple = {name: v for name, v in params.items() if _json_able(v)}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sc, paramMap=simple)
        blob = self.dumps({"params": params, "state": self.state(self.instance) if self.state else None})
        self.sparkSession.createDataFrame([(bytearray(blob),)], "blob binary").coalesce(1).write.parquet(f"{path}/data")


class BlobReader(MLReader):
    """Reads what :class:`BlobWriter` wrote into a new ``cls`` (``loads``: the writer's ``dumps`` undone);
    ``restore(instance, state)`` applies the state."""

    def __init__(
        self,
        cls: type,
        restore: Callable[[Any, Any], Any] | None = None,
        loads: Callable[[bytes], Any] = cloudpickle.loads,
    ) -> None:
        super().__init__()
        self.cls = cls
        self.restore = restore
        self.loads = loads

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        rows = self.sparkSession.read.parquet(f"{path}/data").collect()
        if len(rows) != 1:
            raise ValueError(f"{path}/data should hold one saved {self.cls.__name__}, found {len(rows)} rows.")
        blob = self.loads(bytes(rows[0]["blob"]))
        instance._set(**blob["params"])
        if self.restore is not None:
            self.restore(instance, blob["state"])
        return instance
