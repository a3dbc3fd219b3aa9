"""How TensorFlow tensors reach Hora's engine: directly when eager, through one ``numpy_function`` in a graph.

Hora compiles against no TensorFlow headers, so there is no custom op: a
collective is Python code on numpy buffers (the request layer, with numpy's
adapter), and a group of tensors crosses to it once. Eagerly that is a
direct call on zero-copy views of the tensors, so errors arrive as Hora's own
exceptions. Inside a ``tf.function`` or a ``tf.compat.v1`` graph it is one
stateful ``tf.numpy_function``: stateful ops of one function run in program
order, which is what collectives need (every rank the same sequence).

A crossing costs ~50 µs plus ~8 µs per tensor, so the small tensors of a
group that an elementwise collective treats alike (allreduce, broadcast) are
packed first: flattened and concatenated per dtype in the graph, one buffer
per dtype crosses, and the results are split again (measured here: 50
tensors of 4 KiB cost ~156 µs a step packed, ~1,350 µs as 50 crossings).
A large tensor (256 KiB or more) crosses on its own in the same call. What
crosses is TensorFlow's own buffer, which other ops may read (grappler may
even fold a concatenation into a constant), so the result goes to memory of
this layer's, aligned to 64 bytes, which TensorFlow wraps without copying it
again: an allreduce reads TensorFlow's buffer where it lies and writes the
result there (out of place, no copy); a broadcast copies it there first.

XLA cannot compile a host call (``No registered 'PyFunc' OpKernel for
XLA_CPU_JIT``), so a collective traced under ``jit_compile=True`` raises
:class:`XlaUnsupportedError` (a :class:`hora.HoraError`) at trace time,
naming the fix.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from hora.exceptions import HoraError

__all__ = [
    "XlaUnsupportedError",
    "aligned_empty",
    "check_tensor",
    "check_tensors",
    "cross",
    "cross_packed",
    "request_name",
    "standalone",
]

_ALIGNMENT = 64
# A tensor this large crosses on its own, its result in a buffer of ours; smaller ones are concatenated,
# which costs a copy in and a split out but saves ~8 µs of crossing per tensor (the engine's own threshold
# for running a tensor alone, without a fusion buffer, is the same).
RUNS_ALONE_BYTES = 256 * 1024

# TensorFlow dtypes the engine reduces, as Hora names them in messages.
SUPPORTED_DTYPES = (
    tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool,
)  # fmt: skip
_SUPPORTED_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)

HostFunction = Callable[..., Sequence[np.ndarray]]

# The last crossing built in each tf.compat.v1 graph (see cross()).
_LAST_CROSSING: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# tf.compat.v1 graphs that built crossings: their ordinal and how many crossings each has (see request_name()).
_GRAPH_COUNTS: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
_GRAPH_ORDINALS = itertools.count()  # never reused, even once a graph is gone
_GRAPH_LOCK = threading.Lock()


def check_tensor(tensor: object, caller: str, min_dims: int = 0) -> tf.Tensor:
    """``tensor`` as a tf.Tensor of a dtype the engine supports; raises, quoting it, otherwise."""
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError(
            f"hora.tensorflow.{caller} needs a dense tensor, got tf.IndexedSlices; "
            "hora.tensorflow.allreduce takes IndexedSlices (it allgathers them), or pass tf.convert_to_tensor(x)."
        )
    try:
        t = tf.convert_to_tensor(tensor)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"hora.tensorflow.{caller} expects a tf.Tensor (or a value tf.convert_to_tensor takes), got "
            f"{type(tensor).__name__}: {error}"
        ) from error
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"hora.tensorflow.{caller} does not support dtype {t.dtype.name}; supported dtypes: {_SUPPORTED_NAMES}."
        )
    if t.shape.rank is not None and t.shape.rank < min_dims:
        raise ValueError(f"hora.tensorflow.{caller} needs tensors with at least one dimension; got a scalar.")
    return t


def check_tensors(tensors: object, caller: str, min_dims: int = 0) -> list[tf.Tensor]:
    """The tensors of a grouped call, each checked by :func:`check_tensor`."""
    if isinstance(tensors, (tf.Tensor, tf.Variable, np.ndarray)) or not isinstance(tensors, Sequence):
        raise TypeError(f"hora.tensorflow.{caller} expects a list of tensors, got {type(tensors).__name__}.")
    return [check_tensor(t, caller, min_dims) for t in tensors]


class XlaUnsupportedError(HoraError):
    """Raised when a collective is traced in a function compiled with XLA, which cannot call the host."""

    # Autograph re-raises an error from traced code as its own type only when that type's constructor is
    # Exception's; any other becomes a StagingError, and ``except hvd.HoraError`` would miss it.
    __init__ = Exception.__init__


def refuse_xla(caller: str) -> None:
    """Raises HoraError when the graph being traced is compiled by XLA, which cannot call the host."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # a TensorFlow without the helper: XLA's own error will have to do
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise XlaUnsupportedError(
            f"hora.tensorflow.{caller} cannot run in a function compiled with XLA (jit_compile=True): Hora's "
            "collectives call its engine on the host through tf.numpy_function, which XLA cannot compile. "
            "Compile the training step without XLA: tf.function(jit_compile=False), or "
            "model.compile(..., jit_compile=False) in Keras."
        )


def cross(
    host: HostFunction, inputs: Sequence[tf.Tensor], output_dtypes: Sequence[tf.DType], caller: str
) -> list[tf.Tensor]:
    """Runs ``host(*arrays)`` on the values of ``inputs`` and returns its arrays as tensors.

    Eagerly, ``host`` runs now on zero-copy views (it must not write into
    them); in a graph, it runs as one stateful ``tf.numpy_function`` each
    time the graph does. ``host`` returns one array per ``output_dtypes``.
    """
    if tf.executing_eagerly():
        outputs = host(*[t.numpy() for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, output_dtypes, strict=True)]
    refuse_xla(caller)
    graph = tf.compat.v1.get_default_graph()
    # A tf.function orders its stateful ops itself. A tf.compat.v1 graph run by a Session does not: ops with no
    # data dependency run side by side, and a host call blocks its thread, so two ranks running two collectives
    # in opposite orders would wait for each other forever. There each crossing waits for the one built before it
    # (the build order is the same on every rank); see also standalone().
    previous = [] if graph.building_function else [op for op in [_LAST_CROSSING.get(graph)] if op is not None]
    with tf.control_dependencies(previous):
        outputs = tf.numpy_function(host, list(inputs), list(output_dtypes), stateful=True,
                                    name=f"Hora{_camel(caller)}")  # fmt: skip
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if not graph.building_function:
        _LAST_CROSSING[graph] = outputs[0].op if outputs and isinstance(outputs[0], tf.Tensor) else outputs[0]
    return outputs


@contextlib.contextmanager
def standalone() -> Iterator[None]:
    """In a ``tf.compat.v1`` graph: the crossings built inside wait for no earlier one, and no later one waits
    for them (for ops run on their own, like the initial broadcast of the variables)."""
    graph = tf.compat.v1.get_default_graph()
    saved = _LAST_CROSSING.pop(graph, None)
    try:
        yield
    finally:
        if saved is None:
            _LAST_CROSSING.pop(graph, None)
        else:
            _LAST_CROSSING[graph] = saved


def request_name(name: str | None) -> str | None:
    """The name a crossing being built gives its requests: ``name``, or None for the engine's automatic names.

    Eagerly and in a ``tf.function`` (whose stateful ops run in program
    order) the automatic names serve. A ``tf.compat.v1`` graph run by a
    Session runs ops with no data dependency side by side, so there each
    crossing is named when it is built, ``tf.graph<g>.<n>``: the n-th
    crossing of the g-th graph, the same on every rank that builds the same
    graphs (the engine matches requests by name, whatever order they come in).
    """
    if name is not None or tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    if graph.building_function:
        return None
    with _GRAPH_LOCK:
        ordinal, count = _GRAPH_COUNTS[graph] if graph in _GRAPH_COUNTS else (next(_GRAPH_ORDINALS), 0)
        _GRAPH_COUNTS[graph] = (ordinal, count + 1)
    return f"tf.graph{ordinal}.{count}"


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + _ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def cross_packed(
    run: Callable[[list[np.ndarray], list[np.ndarray]], None],
    tensors: Sequence[tf.Tensor],
    caller: str,
    *,
    reads_inputs: bool = False,
) -> list[tf.Tensor]:
    """Runs an elementwise collective over ``tensors`` in one crossing, small tensors packed per dtype.

    ``run(inputs, outputs)`` writes the collective's result into each output,
    a buffer this layer owns. With ``reads_inputs`` (an allreduce) the inputs
    are TensorFlow's own buffers, which the collective only reads; otherwise
    each output starts as a copy of its input and is the input too. Returns
    one tensor per input, of its shape and dtype.
    """
    packs: list[list[int]] = []  # the tensors of each buffer that crosses
    small: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(tensors):
        size = t.shape.num_elements() if t.shape.is_fully_defined() else None
        if size is not None and size * t.dtype.size >= RUNS_ALONE_BYTES:
            packs.append([i])
        elif t.dtype in small:
            small[t.dtype].append(i)
        else:
            small[t.dtype] = [i]
            packs.append(small[t.dtype])
    flats = []
    for pack in packs:
        parts = [tf.reshape(tensors[i], [-1]) for i in pack]
        flats.append(tf.concat(parts, axis=0) if len(parts) > 1 else parts[0])
    spares = _Spares()

    def host(*arrays: np.ndarray) -> list[np.ndarray]:
        # Never into TensorFlow's own buffers, not even a concatenation: grappler may fold it into a constant
        # or share it between two identical calls.
        if reads_inputs:
            outputs = [spares.take(i, a) for i, a in enumerate(arrays)]
            run(list(arrays), outputs)
        else:
            outputs = [spares.copy(i, a) for i, a in enumerate(arrays)]
            run(outputs, outputs)
        return outputs

    results: list[Any] = [None] * len(tensors)
    outputs = cross(host, flats, [tensors[pack[0]].dtype for pack in packs], caller)
    for pack, flat, packed in zip(packs, flats, outputs, strict=True):
        packed.set_shape(flat.shape)
        pieces = tf.split(packed, [_size(tensors[i]) for i in pack], axis=0) if len(pack) > 1 else [packed]
        for i, piece in zip(pack, pieces, strict=True):
            results[i] = _reshaped(piece, tensors[i])
    return results


class _Spares:
    """The aligned buffers one crossing's results land in (a broadcast's inputs are copied there first),
    reused from run to run when free.

    A fresh buffer each run would cost a page fault per 4 KiB (and the
    kernel zeroing the page) every step. Each run hands TensorFlow a new view
    of a slot's buffer; TensorFlow keeps the view alive for as long as it
    uses its memory (a tensor it wrapped around it), so the buffer is free
    again once the view is gone. Inside a training step's ``tf.function``
    TensorFlow lets go of a step's results only once the next step's
    crossing has started (the MLP of ``bench/tf_training.py``
    allocated all its result buffers afresh on every step with one buffer
    per slot), so each slot keeps a few.
    """

    __slots__ = ("_lock", "_slots", "fresh")

    _PER_SLOT = 3  # buffers a slot keeps: the one in use, the previous step's still held, one spare

    def __init__(self) -> None:
        self._slots: dict[int, list[tuple[np.ndarray, weakref.ref]]] = {}
        self._lock = threading.Lock()  # one traced function may run on several threads at once
        self.fresh = 0  # buffers allocated, for tests

    def copy(self, slot: int, array: np.ndarray) -> np.ndarray:
        """A view of a free aligned buffer of ``array``'s shape and dtype, holding a copy of it."""
        view = self.take(slot, array)
        np.copyto(view, array)
        return view

    def take(self, slot: int, array: np.ndarray) -> np.ndarray:
        """A view of a free aligned buffer of ``array``'s shape and dtype (its contents undefined)."""
        with self._lock:
            kept = self._slots.setdefault(slot, [])
            for index, (buffer, handed_out) in enumerate(kept):
                if buffer.shape == array.shape and buffer.dtype == array.dtype and handed_out() is None:
                    view = buffer.view()
                    kept[index] = (buffer, weakref.ref(view))
                    return view
            buffer = aligned_empty(array.shape, array.dtype)
            self.fresh += 1
            view = buffer.view()
            kept.append((buffer, weakref.ref(view)))
            if len(kept) > self._PER_SLOT:
                kept.pop(0)  # the oldest, still held by TensorFlow (which keeps its memory) or of another shape
            return view


def _size(tensor: tf.Tensor) -> Any:
    """The number of elements of ``tensor``: a Python int when static, else a scalar tensor."""
    if tensor.shape.is_fully_defined():
        return tensor.shape.num_elements()
    return tf.size(tensor)


def _reshaped(flat: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    shape = like.shape.as_list() if like.shape.is_fully_defined() else tf.shape(like)
    out = tf.reshape(flat, shape)
    out.set_shape(like.shape)
    return out


def _camel(caller: str) -> str:
    return "".join(part.capitalize() for part in caller.split("_"))
