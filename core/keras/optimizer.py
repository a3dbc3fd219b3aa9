"""``DistributedOptimizer`` for Keras 3: gradients averaged across ranks inside ``Optimizer.apply``.

Every backend's training step reaches ``Optimizer.apply(grads, variables)``
(TensorFlow's ``model.fit`` inside its ``tf.function``, torch's eagerly,
JAX's inside ``jit`` through ``stateless_apply``), before Keras unscales,
clips or decays anything, so that is where the gradients are exchanged: once
per step, all of them as one group. The
wrapper is an instance of a subclass of the optimizer's own class, made from
its config, so ``get_config`` round-trips and ``isinstance`` still holds.

On TensorFlow, ``model.compile(jit_compile="auto")`` (Keras's default)
resolves to False, with one warning, for a model whose optimizer is
distributed, as Keras does under ``tf.distribute``: XLA cannot call the
host. An explicit ``jit_compile=True`` fails at trace time with
:class:`hora.tensorflow.XlaUnsupportedError`, which names the fix.

With mixed precision, wrap the ``LossScaleOptimizer`` (or let this do it
when the global dtype policy is ``mixed_float16``, as ``compile`` would):
the exchange then runs before its finite check, on every rank alike, so a
rank whose gradients overflowed skips the step together with the others
instead of leaving them waiting.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import keras
from hora.compression import Compression, Compressor
from hora.ops import Average
from hora.process_sets import ProcessSet, global_process_set

__all__ = ["DistributedOptimizer"]

Exchange = Callable[[list[Any], list[Any]], list[Any]]


class _DistributedOptimizer:
    """What a distributed optimizer adds to the user's optimizer class."""

    _hora_exchange: Exchange
    _hora_exchanged = False  # set while stateless_apply runs apply on gradients it has exchanged already
    # backward_passes_per_step > 1: Keras accumulates (gradient_accumulation_steps) and the exchange waits for
    # the update step, where the accumulated mean reaches _clip_gradients (TensorFlow, torch; JAX's optimizer
    # computes every micro-step's update anyway, so there the exchange stays in stateless_apply); the mean is
    # multiplied back to Horovod's sum there.
    _hora_accumulating = False
    _hora_aggregate_scale = 1.0
    _hora_variables: list[Any] | None = None

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        """Averages ``grads`` across ranks, then applies them as the wrapped optimizer does."""
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)  # it may be an iterator: read it once
        if not self._hora_exchanged and not self._hora_accumulating:
            variables = trainable_variables if trainable_variables is not None else self._trainable_variables
            grads = self._hora_exchange(list(grads), list(variables))
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def stateless_apply(self, optimizer_variables: Any, grads: Sequence[Any], trainable_variables: Any) -> Any:
        """JAX's path (inside ``jit``): averages ``grads`` across ranks first, then as the wrapped optimizer does.

        A LossScaleOptimizer checks finiteness here, before ``apply``: the
        exchange must come before that check on every rank.
        """
        grads = self._hora_exchange(list(grads), list(self._trainable_variables))
        self._hora_exchanged = True
        try:
            return super().stateless_apply(optimizer_variables, grads, trainable_variables)  # type: ignore[misc]
        finally:
            self._hora_exchanged = False

    def _backend_apply_gradients(self, grads: list[Any], trainable_variables: list[Any]) -> Any:
        # What _clip_gradients' gradients belong to; set past Keras's __setattr__, whose tracker would take a
        # list of variables for the optimizer's own.
        object.__setattr__(self, "_hora_variables", list(trainable_variables))
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)  # type: ignore[misc]
        finally:
            object.__setattr__(self, "_hora_variables", None)

    def _clip_gradients(self, grads: list[Any]) -> list[Any]:
        """With accumulation, the update step's accumulated gradients: exchanged here, before Keras clips them.

        TensorFlow and torch reach this on update steps only. On JAX the
        gradients were exchanged in ``stateless_apply`` at every micro-step
        (Keras's JAX optimizer computes every micro-step's update, keeping it
        on update steps only): the same mean, more traffic.
        """
        if self._hora_accumulating:
            if not self._hora_exchanged:
                variables = self._hora_variables if self._hora_variables is not None else self._trainable_variables
                grads = self._hora_exchange(list(grads), list(variables))
            if self._hora_aggregate_scale != 1.0:
                grads = [None if g is None else g * self._hora_aggregate_scale for g in grads]
        return super()._clip_gradients(grads)  # type: ignore[misc]


_CLASSES: dict[type, type] = {}


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` was made by :func:`DistributedOptimizer`."""
    return isinstance(optimizer, _DistributedOptimizer)


def _distributed_class(optimizer_class: type) -> type:
    found = _CLASSES.get(optimizer_class)
    if found is None:
        # The wrapped class's name and module: a saved model names the optimizer Keras knows, so plain
        # keras.models.load_model restores it undistributed and hora.keras.load_model distributed.
        namespace = {"__module__": optimizer_class.__module__, "__qualname__": optimizer_class.__qualname__}
        found = _CLASSES[optimizer_class] = type(
            optimizer_class.__name__, (_DistributedOptimizer, optimizer_class), namespace
        )
    return found


def _resolve_auto_jit_compile_without_xla() -> None:
    """Makes Keras's ``jit_compile="auto"`` resolve to False for models with a distributed optimizer (TensorFlow).

    Keras resolves "auto" in ``Trainer._resolve_auto_jit_compile`` once the
    optimizer is set (in ``compile``), and turns it off itself under
    ``tf.distribute``; there is no public hook, so the method is wrapped
    once per process. Any other model resolves as before.
    """
    from keras.src.trainers.trainer import Trainer

    resolve = Trainer._resolve_auto_jit_compile
    if getattr(resolve, "hora_wrapped", False):
        return
    warned: weakref.WeakSet = weakref.WeakSet()  # compile resolves twice (its setattr reads the property first)

    def resolve_without_xla(model: Any) -> bool:
        resolved = resolve(model)
        optimizer = getattr(model, "optimizer", None)
        distributed = is_distributed(optimizer) or is_distributed(getattr(optimizer, "inner_optimizer", None))
        if resolved and distributed and keras.backend.backend() == "tensorflow":
            if model in warned:
                return False
            warned.add(model)
            warnings.warn(
                f"jit_compile='auto' resolves to False for {model.name!r}: its optimizer is a "
                "hora.keras.DistributedOptimizer, whose gradient exchange calls the host, which XLA cannot compile "
                "(Keras does the same under tf.distribute).",
                stacklevel=3,
            )
            return False
        return resolved

    resolve_without_xla.hora_wrapped = True  # type: ignore[attr-defined]
    Trainer._resolve_auto_jit_compile = resolve_without_xla


def _exchange(backend: str, **options: Any) -> Exchange:
    """The gradient exchange of Keras's ``backend``."""
    if backend == "tensorflow":
        from hora.tensorflow.gradients import GradientExchange

        return GradientExchange(**options, caller="keras.DistributedOptimizer")
    if backend == "torch":
        from hora.keras.torch_exchange import TorchGradientExchange

        return TorchGradientExchange(**options, caller="keras.DistributedOptimizer")
    if backend == "jax":
        from hora.jax.gradients import GradientExchange as JaxGradientExchange

        return JaxGradientExchange(**options, caller="keras.DistributedOptimizer")
    raise NotImplementedError(
        f"hora.keras.DistributedOptimizer supports Keras's tensorflow, jax and torch backends; this process runs "
        f"the {backend!r} backend."
    )


def DistributedOptimizer(  # noqa: N802 - Horovod's name for it
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Compressor = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[Any]] | None = None,
    process_set: ProcessSet = global_process_set,
) -> keras.optimizers.Optimizer:
    """Returns ``optimizer`` as one whose ``apply`` first averages the gradients across ranks.

    Args:
        optimizer: a Keras 3 optimizer (not yet used to train: its config is copied).
        name: the new optimizer's name (default: the wrapped one's).
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.fp16`` sends floating-point gradients as float16.
        sparse_as_dense: reduce sparse gradients as dense tensors.
        backward_passes_per_step: micro-steps whose gradients are accumulated
            locally (Keras's ``gradient_accumulation_steps``) and exchanged
            once, at the update step, as Horovod does.
        op: hora.Average (default), Sum, Min, Max or Product.
        gradient_predivide_factor: with Average, divide by this before the sum
            and by ``size / factor`` after it.
        average_aggregated_gradients: with ``backward_passes_per_step`` > 1,
            apply the mean of the accumulated gradients instead of their sum
            (Horovod's default).
        num_groups, groups: send the gradients in groups (default: all in one).
        process_set: the ranks that exchange gradients.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"hora.keras.DistributedOptimizer expects a Keras 3 optimizer, got {optimizer!r}.")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("hora.keras.DistributedOptimizer: this optimizer is already distributed.")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or (
        backward_passes_per_step < 1
    ):  # fmt: skip
        raise ValueError(
            f"hora.keras.DistributedOptimizer: backward_passes_per_step must be a positive integer, got "
            f"{backward_passes_per_step!r}."
        )
    accumulating = backward_passes_per_step > 1
    if accumulating and (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        or keras.config.dtype_policy().name == "mixed_float16"
    ):  # fmt: skip
        raise ValueError(
            "hora.keras.DistributedOptimizer: backward_passes_per_step > 1 with a LossScaleOptimizer (mixed "
            "precision) is not supported: the loss scale's finite check must see the exchanged gradients of every "
            "micro-step. Use backward_passes_per_step=1."
        )
    if accumulating and optimizer.gradient_accumulation_steps not in (None, backward_passes_per_step):
        raise ValueError(
            f"hora.keras.DistributedOptimizer: backward_passes_per_step={backward_passes_per_step} and the "
            f"optimizer's gradient_accumulation_steps={optimizer.gradient_accumulation_steps} disagree; set one."
        )
    if optimizer.built:
        raise ValueError(
            "hora.keras.DistributedOptimizer needs an optimizer that has not been used yet: it is rebuilt from its "
            "config, which holds no state."
        )
    if (
        keras.config.dtype_policy().name == "mixed_float16"
        and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    ):  # fmt: skip
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # compile would wrap it after us: too late
    if keras.backend.backend() == "tensorflow":
        _resolve_auto_jit_compile_without_xla()
    exchange = _exchange(
        keras.backend.backend(), compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups if groups is not None else num_groups,
        process_set=process_set,
    )  # fmt: skip
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if accumulating:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    cls = _distributed_class(type(optimizer))
    distributed = cls.from_config(config)
    distributed._hora_exchange = exchange
    if accumulating:
        distributed._hora_accumulating = True
        # Keras averages the accumulated gradients; Horovod sums them unless average_aggregated_gradients.
        distributed._hora_aggregate_scale = 1.0 if average_aggregated_gradients else float(backward_passes_per_step)
    return distributed
