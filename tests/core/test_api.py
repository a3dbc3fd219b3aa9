"""The Python API in a single-process job: results, and clear errors on misuse."""

from __future__ import annotations

import hora
import ml_dtypes
import numpy as np
import pytest
from hora.settings import Settings

from tests.worker import checked_calls

NUMPY_2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


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


def test_async_handles_and_grouped_calls(single: object) -> None:
    x = np.arange(4.0)
    handle = hora.allreduce_async(x, name="x", op=hora.Sum)
    assert "'x'" in repr(handle)
    result = hora.synchronize(handle)
    assert hora.poll(handle) and hora.synchronize(handle) is result
    np.testing.assert_array_equal(result, x)
    assert result is not x
    tensors = [np.ones(2, np.float32), np.arange(3, dtype=np.int64)]
    outputs = hora.grouped_allreduce(tensors, op=hora.Sum)
    assert [o.dtype for o in outputs] == [np.float32, np.int64]
    np.testing.assert_array_equal(outputs[1], tensors[1])
    assert hora.grouped_allreduce([]) == []
    gathered = hora.synchronize(hora.grouped_allgather_async([np.ones((2, 2)), np.zeros((0, 3))]))
    assert [g.shape for g in gathered] == [(2, 2), (0, 3)]
    assert hora.join() == 0
    hora.barrier()
    with pytest.raises(TypeError, match="expects a handle returned by an \\*_async operation"):
        hora.synchronize(17)
    with pytest.raises(TypeError, match="expects a list of tensors"):
        hora.grouped_allreduce(np.ones(3))


def test_process_set_errors(single: object) -> None:
    assert hora.global_process_set.ranks == [0] and hora.global_process_set.process_set_id == 0
    unregistered = hora.ProcessSet([0])
    with pytest.raises(ValueError, match=r"ProcessSet\(\[0\], process_set_id=None\) is not registered"):
        hora.allreduce(np.ones(2), process_set=unregistered)
    with pytest.raises(ValueError, match="a process set with ranks \\[0\\] exists \\(id 0\\)"):
        hora.add_process_set(unregistered)
    with pytest.raises(ValueError, match=r"ranks \[0, 3\] must be a non-empty subset of 0 .. 0"):
        hora.add_process_set([0, 3])
    with pytest.raises(ValueError, match="distinct non-negative ranks"):
        hora.ProcessSet([1, 1])
    with pytest.raises(TypeError, match=r"process_set must be a hora\.ProcessSet"):
        hora.allreduce(np.ones(2), process_set=[0])
    with pytest.raises(ValueError, match="global process set cannot be removed"):
        hora.remove_process_set(hora.global_process_set)
    assert not hora.remove_process_set(unregistered)


def test_timeline_in_a_single_process(single: object, tmp_path) -> None:
    import json

    path = tmp_path / "t.json"
    hora.start_timeline(str(path))
    hora.allreduce(np.ones(3), name="solo")
    hora.stop_timeline()
    hora.stop_timeline()  # a second stop does nothing
    events = json.loads(path.read_text())
    assert {"solo"} <= {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    with pytest.raises(ValueError, match=r"Cannot write the timeline to '/nonexistent/dir/t\.json'"):
        hora.start_timeline("/nonexistent/dir/t.json")


def test_shutdown_fails_later_calls_clearly() -> None:
    hora.init()
    job = hora.basics.current_job()
    hora.shutdown()
    with pytest.raises(hora.HoraError, match=r"Hora shut down \(rank 0 called hora.shutdown\(\) or exited\)"):
        job.engine.submit([hora._native.Request(hora._native.RequestKind.BARRIER, "late")])


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
    horovod = Settings.from_env(
        {
            "HOROVOD_CACHE_CAPACITY": "16",
            "HOROVOD_TIMELINE": "/tmp/t.json",
            "HOROVOD_TIMELINE_MARK_CYCLES": "true",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
        }
    )
    assert (horovod.cache_capacity, horovod.timeline_filename, horovod.timeline_mark_cycles) == (
        16,
        "/tmp/t.json",
        True,
    )
    assert (horovod.stall_warning_seconds, horovod.stall_shutdown_seconds) == (5.0, 30.0)
    assert Settings.from_env({"HORA_STALL_CHECK_DISABLE": "1"}).stall_warning_seconds == 0.0
    with pytest.raises(ValueError, match=r"HORA_TIMELINE_MARK_CYCLES='maybe' is not a boolean"):
        Settings.from_env({"HORA_TIMELINE_MARK_CYCLES": "maybe"})
    assert (Settings.from_env({}).transport, Settings.from_env({}).hierarchical_allreduce) == ("auto", None)
    assert Settings.from_env({"HORA_TRANSPORT": "TCP"}).transport == "tcp"
    assert Settings.from_env({}).shm_single_copy
    assert not Settings.from_env({"HORA_SHM_SINGLE_COPY": "0"}).shm_single_copy
    tuned = Settings.from_env(
        {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "/tmp/a.csv", "HORA_CYCLE_TIME": "2",
         "HORA_CACHE_CAPACITY": "0"}
    )  # fmt: skip
    assert (tuned.autotune, tuned.autotune_log, tuned.autotune_fixed) == (True, "/tmp/a.csv", ("cycle_time", "cache"))
    options = tuned.engine_options([0, 0], 5.0)
    fixed = ["cycle_time", "cache"]
    assert (options.autotune, options.autotune_log, options.autotune_fixed) == (True, "/tmp/a.csv", fixed)
    assert (options.cycle_time_ms, options.cache_capacity, options.hosts, options.shutdown_timeout_seconds) == (
        2.0, 0, [0, 0], 5.0,
    )  # fmt: skip
    defaults, engine = Settings.from_env({}), hora._native.EngineOptions()  # the engine's defaults are the workers'
    assert (defaults.fusion_threshold_bytes, defaults.cycle_time_ms, defaults.cache_capacity) == (
        engine.fusion_threshold_bytes, engine.cycle_time_ms, engine.cache_capacity,
    )  # fmt: skip
    assert (defaults.autotune, defaults.autotune_warmup_samples, defaults.autotune_steps_per_sample) == (False, 3, 10)
    with pytest.raises(ValueError, match=r"HORA_AUTOTUNE_STEPS_PER_SAMPLE='0' is below the minimum of 1"):
        Settings.from_env({"HORA_AUTOTUNE_STEPS_PER_SAMPLE": "0"})
    with pytest.raises(ValueError, match=r"HORA_TRANSPORT='udp' is not one of auto, tcp"):
        Settings.from_env({"HORA_TRANSPORT": "udp"})
    assert Settings.from_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}).hierarchical_allreduce is True
    assert Settings.from_env({"HORA_HIERARCHICAL_ALLREDUCE": "0"}).hierarchical_allreduce is False


def test_import_hora_imports_no_framework() -> None:
    import subprocess
    import sys

    frameworks = "('torch', 'tensorflow', 'keras', 'jax', 'pyspark', 'ray')"
    code = f"import sys, hora; print([m for m in {frameworks} if m in sys.modules])"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_horovods_topology_and_build_queries(single: object, monkeypatch) -> None:
    import dataclasses

    from hora import basics, build_info

    job = basics.current_job()
    assert hora.is_homogeneous()  # one rank on one host
    for hosts, homogeneous in (((0, 0, 1, 1), True), ((0, 0, 1), False), ((0, 1, 2), True)):
        monkeypatch.setattr(job, "place", dataclasses.replace(job.place, hosts=hosts))
        assert hora.is_homogeneous() is homogeneous, hosts
    assert hora.gloo_enabled() is False
    assert (build_info.ddl_built(), build_info.ccl_built()) == (False, False)


def test_is_homogeneous_needs_a_job() -> None:
    hora.shutdown()
    with pytest.raises(hora.NotInitializedError):
        hora.is_homogeneous()


def test_the_network_interface_decides_where_a_rank_listens_and_what_it_advertises() -> None:
    import socket

    # A launcher's bind and advertise addresses give way to the interface the ranks are told to talk over.
    named = Settings.from_env({"HORA_BIND_ADDR": "0.0.0.0", "HORA_ADVERTISE_ADDR": "10.1.1.1",
                               "HORA_NETWORK_INTERFACE": "lo"})  # fmt: skip
    assert (named.bind_host, named.advertise_host) == ("127.0.0.1", "127.0.0.1")
    everywhere = Settings.from_env({"HORA_BIND_ADDR": "0.0.0.0"})
    assert (everywhere.bind_host, everywhere.advertise_host) == ("0.0.0.0", socket.gethostname())
    told = Settings.from_env({"HORA_BIND_ADDR": "0.0.0.0", "HORA_ADVERTISE_ADDR": "10.1.1.1"})
    assert told.advertise_host == "10.1.1.1"
    assert Settings.from_env({}).bind_host == "127.0.0.1"


def test_horovods_nics_name_one_interface() -> None:
    from hora.settings import one_interface

    assert one_interface("run", None) is None and one_interface("run", set()) is None
    assert one_interface("run", {"eth0"}) == one_interface("run", "eth0") == "eth0"
    with pytest.raises(ValueError, match=r"run: the ranks talk over one network interface; give nics=\{'eth0'\}, got"):
        one_interface("run", ["eth0", "eth1"])


def test_a_host_group_with_outputs_reads_its_arrays_and_writes_the_outputs(single: object) -> None:
    """The framework crossings' allreduce (hora._forms.call's outputs): results in buffers of their own, the arrays
    only read (they may be read-only, as JAX's are), bfloat16 as its bits; any other collective is refused."""
    from hora import _forms
    from hora.ops import host_group

    arrays = [np.arange(5, dtype=np.float32), np.ones(3, ml_dtypes.bfloat16)]
    for array in arrays:
        array.flags.writeable = False
    outputs = [np.zeros_like(a) for a in arrays]
    every = {"name": None, "process_set": hora.global_process_set}
    result = host_group(_forms.ALLREDUCE, arrays, in_place=True, outputs=outputs, op=hora.Sum, postscale_factor=2.0,
                        **every)  # fmt: skip
    assert len(result) == 2 and all(r is o for r, o in zip(result, outputs, strict=True))
    np.testing.assert_array_equal(arrays[0], np.arange(5))
    np.testing.assert_array_equal(outputs[0], np.arange(5) * 2.0)
    np.testing.assert_array_equal(outputs[1].astype(np.float32), np.full(3, 2.0))
    with pytest.raises(ValueError, match="outputs are for an allreduce, one per tensor"):
        host_group(_forms.BROADCAST, arrays[:1], in_place=True, outputs=outputs[:1], root_rank=0, **every)


def test_blocking_in_place_forms_run_in_one_native_call_given_plain_arguments(single: object) -> None:
    """allreduce(_)/broadcast(_) of an array the engine reads as it is skip the request layer
    (hora._forms.run_in_place), with the same results and the same conversions of the arguments (int and bool
    factors, numpy roots); anything else takes the checked path, which converts it or says why not."""
    with checked_calls() as checked:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        assert hora.allreduce_(x, op=hora.Sum, prescale_factor=2.0, postscale_factor=1.5) is x
        np.testing.assert_array_equal(x, np.arange(6).reshape(2, 3) * 3.0)
        copy = hora.allreduce(x, op=hora.Sum, postscale_factor=0.5, name="half")
        np.testing.assert_array_equal(copy, x * 0.5)
        assert copy is not x and copy.dtype == x.dtype
        assert hora.broadcast_(x, 0) is x
        np.testing.assert_array_equal(hora.broadcast(np.ones(3, bool), root_rank=0), np.ones(3, bool))
        np.testing.assert_array_equal(hora.allreduce(x, op=hora.Sum, prescale_factor=2, postscale_factor=True), x * 2)
        np.testing.assert_array_equal(hora.broadcast(x, np.int64(0)), x)
        assert checked == []  # all of them took the one native call

        bf = np.ones(3, ml_dtypes.bfloat16)  # no buffer format: declined, then reduced by the checked path
        np.testing.assert_array_equal(hora.allreduce_(bf, op=hora.Sum).astype(np.float32), np.ones(3))
        np.testing.assert_array_equal(hora.allreduce(x, op=hora.Sum, prescale_factor=np.float32(2)), x * 2)
        assert len(checked) == 2
        frozen = np.ones(2)
        frozen.flags.writeable = False
        declined = [
            (lambda: hora.allreduce_(frozen), ValueError, "works in place and needs a writable array"),
            (lambda: hora.allreduce(np.ones((4, 4))[:, ::2]), ValueError, "needs a C-contiguous array"),
            (lambda: hora.allreduce(np.ones(2, np.complex64)), TypeError, "does not support dtype complex64"),
            (lambda: hora.allreduce_(np.ones(2, ">f4")), TypeError, "does not support dtype >f4"),
            (lambda: hora.allreduce_(np.ones(2), op="sum"), TypeError, "op must be one of"),
            (lambda: hora.allreduce_(np.ones(2), name=""), ValueError, "name must be a non-empty string"),
            (lambda: hora.broadcast_(np.ones(2), root_rank=1), ValueError, r"root_rank=1 is not a rank of this job"),
            (lambda: hora.broadcast_(np.ones(2), root_rank=True), ValueError, r"root_rank=True is not a rank"),
            (lambda: hora.allreduce_(np.ones(2), process_set=hora.ProcessSet([0])), ValueError, "is not registered"),
            (lambda: hora.allreduce_(np.ones(2), process_set=[0]), TypeError, "must be a hora.ProcessSet"),
        ]
        if NUMPY_2:  # numpy 1.x has no arrays of more than 32 dimensions
            declined.append((lambda: hora.allreduce(np.ones([1] * 33)), ValueError, "at most 32 dimensions, got 33"))
        for index, (form, error, message) in enumerate(declined):
            with pytest.raises(error, match=message):
                form()
            assert len(checked) == 3 + index, index


def test_named_asynchronous_in_place_forms_submit_in_one_native_call_given_plain_arguments(single: object) -> None:
    """allreduce_async_/broadcast_async_ of a named array the engine reads as it is skip the request layer too
    (hora._forms.run_in_place with wait=False): synchronize returns the array, reduced as the checked path reduces
    it; unnamed calls take the checked path, which counts their automatic names, and so does what it declines."""
    with checked_calls() as checked:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        y = np.arange(4, dtype=np.int64)
        handles = [
            hora.allreduce_async_(x, name="x", op=hora.Sum, prescale_factor=2, postscale_factor=1.5),
            hora.allreduce_async_(y, name="y", op=hora.Max),
            hora.broadcast_async_(np.ones(3, bool), 0, name="b"),
        ]
        assert all(isinstance(handle, hora.Handle) for handle in handles)
        assert hora.synchronize(handles[0]) is x and hora.synchronize(handles[1]) is y
        np.testing.assert_array_equal(x, np.arange(6).reshape(2, 3) * 3.0)
        np.testing.assert_array_equal(y, np.arange(4))
        np.testing.assert_array_equal(hora.synchronize(handles[2]), np.ones(3, bool))
        assert hora.synchronize(handles[0]) is x  # again: the same result
        assert checked == []

        z = np.ones(2)
        np.testing.assert_array_equal(hora.synchronize(hora.allreduce_async_(z, op=hora.Sum)), np.ones(2))
        assert checked == ["allreduce"]  # unnamed: its automatic name is the checked path's
        frozen = np.ones(2)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="works in place and needs a writable array"):
            hora.allreduce_async_(frozen, name="frozen")
        with pytest.raises(ValueError, match=r"root_rank=1 is not a rank of this job"):
            hora.broadcast_async_(np.ones(2), 1, name="root")
        assert checked == ["allreduce", "allreduce", "broadcast"]
    assert hora.basics.current_job().engine.open_handles == 0


def test_the_engines_one_call_form_declines_what_it_cannot_read_as_it_is(single: object) -> None:
    engine = hora.basics.current_job().engine
    kind, total = hora._native.RequestKind, hora._native.ReduceOp.SUM
    x = np.arange(4, dtype=np.int64)
    assert engine.try_run_in_place(kind.ALLREDUCE, "x", x, total, 3.0, 1.0, -1, 0)
    np.testing.assert_array_equal(x, np.arange(4) * 3)
    assert engine.try_run_in_place(kind.BROADCAST, "y", bytearray(b"ab"), total, 1.0, 1.0, 0, 0)
    frozen = np.ones(2)
    frozen.flags.writeable = False
    declined = [frozen, np.ones((4, 4))[:, ::2], np.ones(2, np.complex64), np.ones(2, ">f4"), b"read-only", 7]
    if NUMPY_2:
        declined.append(np.ones([1] * 33))
    for buffer in declined:
        assert not engine.try_run_in_place(kind.ALLREDUCE, "z", buffer, total, 1.0, 1.0, -1, 0)
    with pytest.raises(ValueError, match="try_run_in_place is for an allreduce or a broadcast; got kind allgather"):
        engine.try_run_in_place(kind.ALLGATHER, "w", x, total, 1.0, 1.0, -1, 0)
    with pytest.raises(ValueError, match="Average is not defined for bool"):  # the engine's own checks still apply
        engine.try_run_in_place(kind.ALLREDUCE, "v", np.ones(2, bool), hora._native.ReduceOp.AVERAGE, 1.0, 1.0, -1, 0)
    # The same, submitted: a handle to wait for, or -1 having done nothing.
    handle = engine.try_submit_in_place(kind.ALLREDUCE, "x", x, total, 2.0, 1.0, -1, 0)
    assert handle >= 0
    engine.wait([handle])
    np.testing.assert_array_equal(x, np.arange(4) * 6)
    for buffer in declined:
        assert engine.try_submit_in_place(kind.ALLREDUCE, "z", buffer, total, 1.0, 1.0, -1, 0) == -1
    with pytest.raises(ValueError, match="try_submit_in_place is for an allreduce or a broadcast; got kind allgather"):
        engine.try_submit_in_place(kind.ALLGATHER, "w", x, total, 1.0, 1.0, -1, 0)
    assert engine.open_handles == 0
