"""Broadcasting TensorFlow variables: one crossing for all of them, then an assignment each."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf
from hora._arrays import check_root
from hora.basics import current_job
from hora.process_sets import ProcessSet, global_process_set, set_id
from hora.tensorflow.collectives import broadcast_group
from hora.tensorflow.crossing import check_tensor, standalone

# Autograph would rewrite these functions' Python control flow when a tf.function calls them: they are
# host-side code that builds ops, so they run as written.
_not_converted = tf.autograph.experimental.do_not_convert

__all__ = ["BroadcastGlobalVariablesHook", "broadcast_", "broadcast_global_variables", "broadcast_variables"]


def _assigned(variables: list[Any], root_rank: int, name: str | None, process_set: ProcessSet, caller: str) -> list:
    """Assigns ``root_rank``'s value to every variable (one crossing for all); returns the assign ops."""
    for v in variables:
        if not hasattr(v, "assign"):
            raise TypeError(f"hora.tensorflow.{caller} expects variables, got {type(v).__name__}: {v!r}.")
    set_id(process_set, f"tensorflow.{caller}")
    root = check_root(root_rank, current_job().size, f"tensorflow.{caller}")
    if not variables:
        return []
    with standalone():  # run on its own, at the start: it must not wait for (or hold up) the training step's
        values = [check_tensor(v, caller) for v in variables]
        received = broadcast_group(values, root, name, process_set, caller)
        return [v.assign(x) for v, x in zip(variables, received, strict=True)]


@_not_converted
def broadcast_(
    variables: Iterable[Any], root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Overwrites ``variables`` on every rank with their values on ``root_rank``, in place.

    Every rank passes the same variables (same shapes and dtypes, same
    order). Eagerly the variables hold the root's values when it returns; in
    a graph the returned assign ops do it when they run.

    Returns:
        The variables (eagerly) or their assign ops (in a graph).
    """
    variables = list(variables)
    assigned = _assigned(variables, root_rank, name, process_set, "broadcast_")
    return variables if tf.executing_eagerly() else assigned


@_not_converted
def broadcast_variables(
    variables: Iterable[Any], root_rank: int, process_set: ProcessSet = global_process_set, inplace: bool = False
) -> Any:
    """Broadcasts ``variables`` from ``root_rank`` to every rank: the usual start of training.

    Typically ``broadcast_variables(model.variables, root_rank=0)`` after the
    model is built, and the optimizer's variables once it has created them.
    All variables cross to the engine at once. ``inplace`` is accepted for
    Horovod compatibility (the assignment is always in place).

    Returns:
        None eagerly; in a graph, the op that assigns them all.
    """
    assigned = _assigned(list(variables), root_rank, None, process_set, "broadcast_variables")
    return None if tf.executing_eagerly() else tf.group(*assigned)


@_not_converted
def broadcast_global_variables(root_rank: int) -> Any:
    """``broadcast_variables`` over ``tf.compat.v1.global_variables()``: graph mode (``tf.compat.v1``) only.

    Raises:
        RuntimeError: eagerly, where there are no global variables; use
            ``broadcast_variables(model.variables, root_rank)``.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "hora.tensorflow.broadcast_global_variables() does not support eager execution: TensorFlow 2 has no "
            "global variables. Use hora.tensorflow.broadcast_variables(<model and optimizer variables>, root_rank)."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A ``tf.compat.v1`` session hook that broadcasts the global variables from ``root_rank`` once the session exists.

    Use it with ``MonitoredTrainingSession`` so every rank starts from the
    same weights, whether they were initialised randomly or restored.
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op: Any = None
        self.device = device  # accepted for Horovod compatibility

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
