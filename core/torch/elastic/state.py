"""TorchState: a model, its optimizer, its sampler and any other attributes, committed and synced as one."""

from __future__ import annotations

import copy
from typing import Any

import torch
from hora import basics
from hora.elastic.state import ObjectState
from hora.objects import broadcast_object
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.state import broadcast_optimizer_state, broadcast_parameters

__all__ = ["StateHandler", "TorchState", "get_handler_registry", "set_handler_registry"]


class StateHandler:
    """How one kind of object is saved, restored, synced and adjusted after a reset."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Adjusts the object to the re-formed job; nothing by default."""

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """An object with ``state_dict``/``load_state_dict``; a deep copy is the saved state."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))


class ModelStateHandler(_StateDictHandler):
    """A ``torch.nn.Module``: its parameters and buffers."""

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A ``torch.optim.Optimizer``: its state and hyperparameters (and a DistributedOptimizer's exchange)."""

    def restore(self) -> None:
        reset_exchange = getattr(self.value, "reset_exchange", None)
        if reset_exchange is not None:  # gradients in flight belong to the job that failed
            reset_exchange()
        super().restore()

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    """An :class:`ElasticSampler`: the epoch and how much of it was processed."""

    def reset(self) -> None:
        # Hosts only removed: no sync follows, so the sampler must re-read the new rank and size itself.
        self.value.reset()


class LRSchedulerStateHandler(_StateDictHandler):
    """A learning-rate scheduler."""


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
    (torch.optim.lr_scheduler.LRScheduler, LRSchedulerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """The ``(type, handler class)`` pairs TorchState tries in order; the first ``isinstance`` match wins."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replaces the handler registry (to teach TorchState a new kind of object)."""
    global _handler_registry
    _handler_registry = registry


class TorchState(ObjectState):
    """The state of a torch training job for :func:`hora.torch.elastic.run`, as Horovod's ``TorchState``.

    Models, optimizers, :class:`ElasticSampler` s and LR schedulers (passed
    as ``model=``, ``optimizer=`` or any keyword) are saved as deep copies of
    their ``state_dict``, restored with ``load_state_dict`` and synced from
    rank 0 (parameters and optimizer state by broadcast); every other keyword
    is a picklable attribute, as in :class:`~hora.elastic.ObjectState`.
    Assigning a new object to a handled attribute saves it at once.

    Args:
        model: the model (optional).
        optimizer: its optimizer (optional).
        **kwargs: more objects and attributes (``sampler=``, ``epoch=0``, ...).
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any) -> None:
        given = {"model": model, "optimizer": optimizer}
        kwargs.update({name: value for name, value in given.items() if value is not None})  # as Horovod
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = next((h for kind, h in _handler_registry if isinstance(value, kind)), None)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler(value)
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()
        super().reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
