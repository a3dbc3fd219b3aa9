"""``DistributedGradientTape``: a ``tf.GradientTape`` whose gradients are averaged across ranks.

As in Horovod, the wrapper is an instance of a subclass of the tape's own
class that takes over the recording the tape made, so it is used where the
tape was::

    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

All gradients of one ``gradient()`` call cross to the engine once (per
group), eagerly or inside ``tf.function``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from hora.compression import Compression, Compressor
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set
from hora.tensorflow.gradients import GradientExchange

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedGradientTape(tf.GradientTape):
    """The methods a distributed tape adds to (or overrides on) the user's tape class."""

    _hora_exchange: GradientExchange
    _hora_local_sources: set[int]
    _hora_scale_local_gradients: bool

    def register_local_source(self, source: Any) -> None:
        """Marks ``source``'s gradient as local: not exchanged (divided by the set size when scaling them)."""
        self._hora_local_sources.add(id(source))

    @tf.autograph.experimental.do_not_convert
    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        use_generic_names: bool = False,
        unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE,
    ) -> Any:
        """The gradients of ``target`` with respect to ``sources``, averaged across ranks.

        Arguments as ``tf.GradientTape.gradient``; ``use_generic_names`` is
        accepted for Horovod compatibility (Hora's request names never depend
        on tensor names).
        """
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients=unconnected_gradients)
        flat_sources, flat_grads = tf.nest.flatten(sources), tf.nest.flatten(grads)
        shared = [i for i, s in enumerate(flat_sources) if id(s) not in self._hora_local_sources]
        exchanged = self._hora_exchange([flat_grads[i] for i in shared], [flat_sources[i] for i in shared])
        results = list(flat_grads)
        for i, g in zip(shared, exchanged, strict=True):
            results[i] = g
        if self._hora_scale_local_gradients and len(shared) < len(results):
            size = self._hora_exchange.process_set.size()
            for i in set(range(len(results))) - set(shared):
                results[i] = _divided(results[i], size)
        return tf.nest.pack_sequence_as(grads, results)


def _divided(grad: Any, size: int) -> Any:
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(size, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(size, grad.dtype)


_CLASSES: dict[type, type] = {tf.GradientTape: _DistributedGradientTape}


def _distributed_class(tape_class: type) -> type:
    """The distributed subclass of ``tape_class`` (made once per class, as Horovod does)."""
    found = _CLASSES.get(tape_class)
    if found is None:
        found = _CLASSES[tape_class] = type(tape_class.__name__, (_DistributedGradientTape, tape_class), {})
    return found


def DistributedGradientTape(  # noqa: N802 - Horovod's name for it
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """Returns ``gradtape`` as a tape whose ``gradient()`` averages the gradients across ranks.

    Args:
        gradtape: a ``tf.GradientTape`` (or subclass), after or before recording.
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.fp16`` sends floating-point gradients as float16.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients as dense tensors
            instead of allgathering them.
        op: hora.Average (default), Sum, Min, Max or Product.
        gradient_predivide_factor: with Average, divide by this before the sum
            and by ``size / factor`` after it.
        num_groups: Horovod's older spelling of an int ``groups``.
        groups: an int: send the gradients in that many groups; a list of
            lists of variables: those variables' gradients each form a group.
            Default: all gradients of a call in one group.
        process_set: the ranks that exchange gradients.
        scale_local_gradients: divide the gradients of sources passed to
            ``register_local_source`` by the set size.
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"hora.tensorflow.DistributedGradientTape expects a tf.GradientTape, got {gradtape!r}.")
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError("hora.tensorflow.DistributedGradientTape: this tape is already distributed.")
    exchange = GradientExchange(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups if groups is not None else num_groups,
        process_set=process_set, caller="tensorflow.DistributedGradientTape",
    )  # fmt: skip
    cls = _distributed_class(type(gradtape))
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recording, persistence and watch settings
    tape._hora_exchange = exchange
    tape._hora_local_sources = set()
    tape._hora_scale_local_gradients = scale_local_gradients
    return tape


def PartialDistributedGradientTape(  # noqa: N802 - Horovod's name for it
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A :func:`DistributedGradientTape` whose ``local_layers`` keep their own gradients (model parallel parts).

    Every trainable weight of ``local_layers`` (a Keras layer or a list of
    them) is a local source: its gradient is not exchanged, and is divided
    by the set size when ``scale_local_gradients``. Other arguments as in
    :func:`DistributedGradientTape`.
    """
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense, op, gradient_predivide_factor,
        num_groups, groups, process_set, scale_local_gradients,
    )  # fmt: skip
    layers = [] if local_layers is None else local_layers if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        if not hasattr(layer, "trainable_weights"):
            raise TypeError(
                f"hora.tensorflow.PartialDistributedGradientTape: local_layers must be Keras layers, got {layer!r}."
            )
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape
