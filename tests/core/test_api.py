"""The Python API in a single-process job: results, and clear errors on misuse."""

from __future__ import annotations

import hora
import ml_dtypes
import numpy as np
import pytest
from hora.settings import Settings


@pytest.fixture
def single() -> object:
    hora.init()
    yield
    hora.shutdown()


def test_calls_before_init_raise() -> None:
    hora.shutdown()
    assert not hora.is_initialized()
    with pytest.raises(hora.NotInitializedError, match=r"call hora.init\(\) first"):
        hora.rank()
    with pytest.raises(hora.NotInitializedError):
        hora.allreduce(np.ones(2))


def test_single_process_world(single: object) -> None:
    assert (hora.rank(), hora.size(), hora.local_rank(), hora.local_size(), hora.cross_rank(), hora.cross_size()) == (
        0,
        1,
        0,
        1,
        0,
        1,
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(hora.allreduce(x), x)
    np.testing.assert_array_equal(hora.allreduce(x, op=hora.Sum, prescale_factor=2, postscale_factor=0.5), x)
    np.testing.assert_array_equal(hora.allgather(x), x)
    np.testing.assert_array_equal(hora.broadcast(x, 0), x)
    np.testing.assert_array_equal(hora.alltoall(x), x)
    np.testing.assert_array_equal(hora.reducescatter(x, op=hora.Sum), x)
    bf = np.ones(3, dtype=ml_dtypes.bfloat16)
    assert hora.allreduce(bf, op=hora.Sum).dtype == bf.dtype
    inplace = x.copy()
    assert hora.allreduce_(inplace) is inplace


def test_misuse_gets_clear_errors(single: object) -> None:
    with pytest.raises(TypeError, match="does not support dtype complex64; supported dtypes: uint8"):
        hora.allreduce(np.ones(3, dtype=np.complex64))
    with pytest.raises(ValueError, match="needs a C-contiguous array"):
        hora.allreduce(np.ones((4, 4))[:, ::2])
    with pytest.raises(ValueError, match=r"root_rank=3 is not a rank of this job; expected 0 <= root_rank < 1"):
        hora.broadcast(np.ones(2), root_rank=3)
    with pytest.raises(ValueError, match="Average is not defined for bool"):
        hora.allreduce(np.ones(2, dtype=bool), op=hora.Average)
    with pytest.raises(TypeError, match="op must be one of"):
        hora.allreduce(np.ones(2), op="sum")
    with pytest.raises(ValueError, match="at least one dimension"):
        hora.allgather(np.float32(1))
    with pytest.raises(ValueError, match=r"splits=\[1, 1\] must hold 1 non-negative row counts"):
        hora.alltoall(np.ones(2), splits=[1, 1])
    with pytest.raises(ValueError, match="works in place and needs a writable array"):
        frozen = np.ones(2)
        frozen.flags.writeable = False
        hora.allreduce_(frozen)


def test_settings_from_env_quote_bad_values() -> None:
    with pytest.raises(ValueError, match=r"HORA_START_TIMEOUT='soon' is not a number"):
        Settings.from_env({"HORA_START_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="HORA_DRIVER_ADDR='nowhere' is not of the form host:port"):
        Settings.from_env({"HORA_DRIVER_ADDR": "nowhere"})
    settings = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "1024", "HORA_CYCLE_TIME": "2.5"})
    assert (settings.fusion_threshold_bytes, settings.cycle_time_ms, settings.driver_address) == (1024, 2.5, None)
    assert (
        Settings.from_env({"HORA_FUSION_THRESHOLD": "7", "HOROVOD_FUSION_THRESHOLD": "9"}).fusion_threshold_bytes == 7
    )


def test_import_hora_imports_no_framework() -> None:
    import subprocess
    import sys

    code = "import sys, hora; print([m for m in ('torch', 'tensorflow', 'pyspark', 'ray') if m in sys.modules])"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
