"""Collectives on arbitrary picklable Python objects (serialised with cloudpickle)."""

from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np
from hora.basics import rank
from hora.ops import allgather, broadcast_
from hora.process_sets import ProcessSet, global_process_set

__all__ = ["allgather_object", "broadcast_object"]


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank of ``process_set`` (other ranks' ``obj`` is ignored).

    Bytes come only from authenticated peers of this job. ``name`` prefixes
    the names of the two broadcasts (length, then bytes) that carry it.
    """
    names = (f"{name}.length", f"{name}.bytes") if name is not None else (None, None)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) if rank() == root_rank else None
    length = np.array([payload.size if payload is not None else 0], dtype=np.int64)
    broadcast_(length, root_rank, names[0], process_set)
    buffer = payload.copy() if payload is not None else np.empty(int(length[0]), dtype=np.uint8)
    broadcast_(buffer, root_rank, names[1], process_set)
    return obj if rank() == root_rank else cloudpickle.loads(buffer.tobytes())


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Returns the list of every member's ``obj``, in rank order."""
    names = (f"{name}.lengths", f"{name}.bytes") if name is not None else (None, None)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    lengths = allgather(np.array([payload.size], dtype=np.int64), names[0], process_set)
    gathered = allgather(payload, names[1], process_set)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [cloudpickle.loads(gathered[offsets[i] : offsets[i + 1]].tobytes()) for i in range(lengths.size)]
