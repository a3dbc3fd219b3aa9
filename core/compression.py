"""Gradient compression, written once for every framework.

A compressor turns a tensor into the tensor that travels (``compress``)
and back (``decompress``), keeping whatever it needs to undo the change in
a context. ``Compression.fp16`` sends floating-point tensors as float16 and
restores their dtype on arrival; other tensors travel unchanged.

The compressors know nothing of any framework. Each framework adapter
registers a small :class:`TensorHooks` for its tensor type (numpy's is
built in; ``hora.torch``, ``hora.tensorflow`` and ``hora.jax`` register
theirs when imported), so the same ``Compression`` object works for every
framework's tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor", "TensorHooks", "register_tensor_hooks"]


@dataclass(frozen=True)
class TensorHooks:
    """What a compressor needs to know about one framework's tensors.

    Attributes:
        is_floating: whether a tensor holds floating-point values.
        dtype: a tensor's dtype, as the framework spells it.
        cast: a copy of a tensor converted to a dtype; ``"float16"`` stands
            for the framework's half-precision type.
    """

    is_floating: Callable[[Any], bool]
    dtype: Callable[[Any], Any]
    cast: Callable[[Any, Any], Any]


_HOOKS: dict[type, TensorHooks] = {}


def register_tensor_hooks(tensor_type: type, hooks: TensorHooks) -> None:
    """Teaches the compressors a framework's tensor type (and its subclasses)."""
    _HOOKS[tensor_type] = hooks


def _hooks(tensor: object) -> TensorHooks:
    for cls in type(tensor).__mro__:
        hooks = _HOOKS.get(cls)
        if hooks is not None:
            return hooks
    raise TypeError(
        f"Hora compression does not know tensors of type {type(tensor).__module__}.{type(tensor).__qualname__}; "
        "import the framework's adapter first (for example, import hora.torch)."
    )


register_tensor_hooks(
    np.ndarray,
    TensorHooks(
        is_floating=lambda a: np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16",
        dtype=lambda a: a.dtype,
        cast=lambda a, dtype: a.astype(np.float16 if dtype == "float16" else dtype),
    ),
)


class Compressor:
    """Interface of a compressor: ``compress`` before sending, ``decompress`` after receiving."""

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        """Returns the tensor to send and the context that ``decompress`` needs."""
        raise NotImplementedError

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        """Returns the received ``tensor`` as the caller's dtype, given ``compress``'s context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes); restores their dtype on arrival."""

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        hooks = _hooks(tensor)
        if not hooks.is_floating(tensor):
            return tensor, None
        dtype = hooks.dtype(tensor)
        return hooks.cast(tensor, "float16"), dtype

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else _hooks(tensor).cast(tensor, ctx)


class Compression:
    """The compressors, by name, as in Horovod: ``Compression.none`` and ``Compression.fp16``."""

    none: Compressor = NoneCompressor()
    fp16: Compressor = FP16Compressor()
