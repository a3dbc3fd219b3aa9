"""Hora: distributed training on a compiled ring-allreduce core.

A script becomes a distributed job with two lines::

    import hora
    hora.init()
    total = hora.allreduce(values, op=hora.Sum)

and is started with ``horarun -np 4 python script.py``. ``import hora`` never
imports a deep-learning framework, Spark or Ray.
"""

from hora.basics import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from hora.exceptions import (
    AuthenticationError,
    HoraError,
    HoraInternalError,
    NotInitializedError,
    RendezvousError,
)
from hora.objects import allgather_object, broadcast_object
from hora.ops import (
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    reducescatter,
)

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "Average",
    "HoraError",
    "HoraInternalError",
    "Max",
    "Min",
    "NotInitializedError",
    "Product",
    "ReduceOp",
    "RendezvousError",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "reducescatter",
    "shutdown",
    "size",
]
