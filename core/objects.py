"""Collectives on arbitrary picklable Python objects (serialised with cloudpickle)."""

from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np
from hora.basics import rank
from hora.ops import allgather, broadcast_

__all__ = ["allgather_object", "broadcast_object"]


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank (other ranks' ``obj`` is ignored).

    Bytes come only from authenticated peers of this job.
    """
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) if rank() == root_rank else None
    length = np.array([payload.size if payload is not None else 0], dtype=np.int64)
    broadcast_(length, root_rank)
    buffer = payload.copy() if payload is not None else np.empty(int(length[0]), dtype=np.uint8)
    broadcast_(buffer, root_rank)
    return obj if rank() == root_rank else cloudpickle.loads(buffer.tobytes())


def allgather_object(obj: Any) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order."""
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    lengths = allgather(np.array([payload.size], dtype=np.int64))
    gathered = allgather(payload)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [cloudpickle.loads(gathered[offsets[i] : offsets[i + 1]].tobytes()) for i in range(lengths.size)]
