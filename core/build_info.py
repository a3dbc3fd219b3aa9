"""What this build of Hora was compiled with, for scripts written against Horovod's queries.

Hora's core has one transport stack of its own (shared memory and TCP) and
compiles against no MPI, Gloo, NCCL or GPU runtime, so each answer is False
but ``mpi_built`` (True with mpi4py installed: Hora then runs under
``mpiexec``); GPU tensors are staged through host memory.
"""

from __future__ import annotations

__all__ = ["ccl_built", "cuda_built", "ddl_built", "gloo_built", "mpi_built", "nccl_built", "rocm_built"]


def mpi_built() -> bool:
    """Whether Hora can run jobs that MPI starts: when mpi4py is installed (``hora[mpi]``).

    Hora compiles against no MPI; under ``mpiexec`` its ranks meet through
    mpi4py and then use Hora's own transports (see :mod:`hora.mpi`).
    """
    from hora.mpi import mpi_available

    return mpi_available()


def gloo_built() -> bool:
    """Whether Hora was built with Gloo: never (its transports are its own)."""
    return False


def nccl_built() -> bool:
    """Whether Hora was built with NCCL: never."""
    return False


def cuda_built() -> bool:
    """Whether Hora's core was built with CUDA: never (CUDA tensors are staged through pinned host memory)."""
    return False


def rocm_built() -> bool:
    """Whether Hora's core was built with ROCm: never."""
    return False


def ddl_built() -> bool:
    """Whether Hora was built with IBM DDL: never."""
    return False


def ccl_built() -> bool:
    """Whether Hora was built with Intel oneCCL: never."""
    return False
