"""Elastic training with TensorFlow (``hvd.elastic`` of ``import hora.tensorflow as hvd``), as Horovod's.

:class:`TensorFlowKerasState` is :class:`hora.keras.elastic.KerasState`;
:class:`TensorFlowState` commits, restores and syncs a list of variables.
Eager TensorFlow 2 only (a ``tf.compat.v1`` session graph is not supported).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from hora import basics
from hora.elastic import HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from hora.objects import broadcast_object
from hora.tensorflow.variables import broadcast_variables

# Also here, from hora.keras.elastic on first use (it imports hora.keras): KerasState (alias
# TensorFlowKerasState), CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback.
__all__ = ["HostsUpdatedInterrupt", "ObjectState", "State", "TensorFlowState", "run", "run_fn"]


def __getattr__(name: str) -> Any:
    # The Keras pieces import keras; load them only when asked for.
    if name in ("KerasState", "TensorFlowKerasState", "CommitStateCallback", "UpdateBatchStateCallback",
                "UpdateEpochStateCallback"):  # fmt: skip
        from hora.keras import elastic

        return getattr(elastic, "KerasState" if name == "TensorFlowKerasState" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TensorFlowState(ObjectState):
    """The state of a list of ``tf.Variable`` s, as Horovod's ``TensorFlowState``.

    :meth:`save` copies their values, :meth:`restore` assigns them back,
    :meth:`sync` broadcasts rank 0's (Horovod's TensorFlow 2 version
    broadcasts only when the state is created; this one at every sync).

    Args:
        variables: the variables to track.
        **kwargs: more picklable attributes (``epoch=0``, ...).
    """

    def __init__(self, variables: Sequence[tf.Variable], **kwargs: Any) -> None:
        if not tf.executing_eagerly():
            raise RuntimeError("hora.tensorflow.elastic.TensorFlowState needs eager execution (TensorFlow 2).")
        self.variables = list(variables)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._values = [np.array(v.numpy(), copy=True) for v in self.variables]
