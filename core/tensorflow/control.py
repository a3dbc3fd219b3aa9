"""join, barrier, and Horovod's graph constants (``size_op``, ``rank_op``, ...), for TensorFlow.

The ``*_op`` functions return int32 tensors computed when the graph runs
(eagerly: now), as Horovod's do, so a traced function reads the job it runs
in rather than the one it was traced in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from hora import basics, ops
from hora.process_sets import ProcessSet, global_process_set, set_id
from hora.tensorflow.crossing import cross

# Autograph would rewrite these functions' Python control flow when a tf.function calls them: they are
# host-side code that builds ops, so they run as written.
_not_converted = tf.autograph.experimental.do_not_convert

__all__ = [
    "barrier",
    "join",
    "local_rank_op",
    "local_size_op",
    "process_set_included_op",
    "rank_op",
    "size_op",
]


@_not_converted
def join() -> tf.Tensor:
    """Declares that this rank has no more batches and serves the others' collectives until all have joined.

    Returns the rank that joined last (an int32 tensor). See :func:`hora.join`.
    """
    return cross(lambda: [np.int32(ops.join())], [], [tf.int32], "join")[0]


@_not_converted
def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """Returns once every rank of ``process_set`` has reached it; in a graph, returns the op that does."""
    set_id(process_set, "tensorflow.barrier")

    def host() -> list[np.ndarray]:
        ops.barrier(process_set)
        return []

    if tf.executing_eagerly():
        host()
        return None
    return cross(host, [], [], "barrier")[0]


def _constant(value: Callable[[], int], caller: str, name: str | None) -> tf.Tensor:
    result = cross(lambda: [np.int32(value())], [], [tf.int32], caller)[0]
    result.set_shape([])
    return result if name is None else tf.identity(result, name=name)


def _members(process_set_id: int, caller: str) -> list[int]:
    """The ranks of the process set ``process_set_id`` (0: every rank)."""
    engine = basics.current_job().engine
    if process_set_id not in engine.process_set_ids():
        raise ValueError(
            f"hora.tensorflow.{caller}: no process set has id {process_set_id!r}; "
            f"registered ids: {sorted(engine.process_set_ids())}."
        )
    return list(engine.process_set(process_set_id))


@_not_converted
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks in the process set, as an int32 tensor computed when the graph runs."""
    return _constant(lambda: len(_members(process_set_id, "size_op")), "size_op", name)


@_not_converted
def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor computed when the graph runs."""
    return _constant(basics.local_size, "local_size_op", name)


@_not_converted
def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor computed when the graph runs."""
    return _constant(basics.rank, "rank_op", name)


@_not_converted
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor computed when the graph runs."""
    return _constant(basics.local_rank, "local_rank_op", name)


@_not_converted
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this process belongs to the process set, else 0 (int32, computed when the graph runs)."""
    return _constant(
        lambda: int(basics.rank() in _members(process_set_id, "process_set_included_op")),
        "process_set_included_op",
        name,
    )
