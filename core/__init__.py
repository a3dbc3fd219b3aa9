"""Hora: distributed training on a compiled ring-allreduce core.

A script becomes a distributed job with two lines::

    import hora
    hora.init()
    total = hora.allreduce(values, op=hora.Sum)

and is started with ``horarun -np 4 python script.py``. ``import hora`` never
imports a deep-learning framework, Spark or Ray.
"""

from hora import elastic
from hora.basics import (
    cross_rank,
    cross_size,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hora.build_info import mpi_built
from hora.exceptions import (
    AuthenticationError,
    HoraError,
    HoraInternalError,
    NotInitializedError,
    RendezvousError,
    RequestError,
)
from hora.handles import Handle, poll, synchronize
from hora.objects import allgather_object, broadcast_object
from hora.ops import (
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)
from hora.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "Average",
    "Handle",
    "HoraError",
    "HoraInternalError",
    "Max",
    "Min",
    "NotInitializedError",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "RendezvousError",
    "RequestError",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "cross_rank",
    "cross_size",
    "elastic",
    "global_process_set",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
