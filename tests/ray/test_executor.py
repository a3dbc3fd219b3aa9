"""RayExecutor on a local Ray: results in rank order with a real allreduce, state, failures, limits."""

from __future__ import annotations

import hora
import numpy as np
import pytest
from hora.exceptions import HoraError
from hora.ray import RayExecutor

pytestmark = pytest.mark.timeout(180)


def _allreduce_rank(offset: int) -> tuple[int, list[float]]:
    return hora.rank(), hora.allreduce(np.array([hora.rank() + offset], dtype=np.float64), op=hora.Sum).tolist()


def test_run_execute_and_execute_single(ray_cluster) -> None:
    with RayExecutor(num_workers=2, cpus_per_worker=0.5) as executor:
        assert executor.run(_allreduce_rank, args=(10,)) == [(0, [21.0]), (1, [21.0])]
        assert executor.execute(lambda s: (s.rank, s.size, s.local_rank, s.local_size)) == [(0, 2, 0, 2), (1, 2, 1, 2)]
        executor.execute(lambda s: s.store.update(count=s.rank + 5))  # state persists between calls
        assert executor.execute(lambda s: s.store["count"]) == [5, 6]
        assert executor.execute_single(lambda s: s.rank) == 0
        refs = executor.run_remote(_allreduce_rank, args=(0,))  # Horovod's: refs of the results
        assert ray_cluster.get(refs) == [(0, [1.0]), (1, [1.0])]
        links = executor.run(lambda: hora.basics.current_job().transport_links())
        assert links == [["self", "shm"], ["shm", "self"]]  # one node: shared memory


def test_a_raising_worker_fails_run_with_its_rank_and_the_executor_restarts(ray_cluster) -> None:
    def fails_on_rank_1() -> None:
        if hora.rank() == 1:
            raise ValueError("boom on purpose")
        hora.allreduce(np.ones(1))  # rank 1 never joins: must fail, not hang

    executor = RayExecutor(num_workers=2, cpus_per_worker=0.5).start()
    with pytest.raises(HoraError, match=r"(?s)rank 1 failed:.*ValueError: boom on purpose"):
        executor.run(fails_on_rank_1)
    with pytest.raises(HoraError, match=r"failed earlier \(rank 1 raised\); call shutdown\(\) and start\(\) again"):
        executor.run(_allreduce_rank, args=(0,))
    executor.shutdown()
    executor.start()
    assert executor.run(_allreduce_rank, args=(1,)) == [(0, [3.0]), (1, [3.0])]
    executor.shutdown()


def test_a_dead_actor_fails_run(ray_cluster) -> None:
    import os

    executor = RayExecutor(num_workers=2, cpus_per_worker=0.5).start()

    def dies_on_rank_1() -> None:
        if hora.rank() == 1:
            os._exit(3)
        hora.allreduce(np.ones(1))

    try:
        with pytest.raises(HoraError, match=r"the actor of rank 1 died \(its process exited or was killed\)"):
            executor.run(dies_on_rank_1)
    finally:
        executor.shutdown()


def _places_before_and_after_init() -> tuple[dict[str, str], list[int]]:
    import os

    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")
    before = {f"{p}_{n}": os.environ.get(f"{p}_{n}", "") for p in ("HORA", "HOROVOD") for n in names}
    after = [hora.rank(), hora.size(), hora.local_rank(), hora.local_size(), hora.cross_rank(), hora.cross_size()]
    return before, after


def test_rank_variables_are_set_before_init(ray_cluster) -> None:
    # The actors' environments get the variables in join(), before hora.init(); Hora never sets them itself.
    names = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")
    with RayExecutor(num_workers=2, cpus_per_worker=0.5) as executor:
        results = executor.run(_places_before_and_after_init)
        node = ray_cluster.get_runtime_context().get_node_id()
    assert [after for _, after in results] == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]]
    for before, after in results:
        for prefix in ("HORA", "HOROVOD"):
            assert [int(before[f"{prefix}_{n}"]) for n in names] == after
            assert before[f"{prefix}_HOSTNAME"] == node


def test_an_unsatisfiable_placement_group_fails_after_the_timeout_naming_resources(ray_cluster) -> None:
    with pytest.raises(HoraError, match=r"could not reserve 3 bundles of \{'CPU': 1\} \(PACK\) within 2 s; the cluster "
                       r"has \{'CPU': 2\.0\} in all"):  # fmt: skip
        RayExecutor(num_workers=3, cpus_per_worker=1, timeout_s=2).start()
    assert ray_cluster.available_resources().get("CPU") == 2.0  # nothing left reserved


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_workers must be a positive integer, got 0"):
        RayExecutor(num_workers=0)
    with pytest.raises(ValueError, match="placement_group_strategy must be 'PACK' or 'SPREAD', got 'X'"):
        RayExecutor(num_workers=2, placement_group_strategy="X")
    with pytest.raises(HoraError, match="not started"):
        RayExecutor(num_workers=2).run(print)


def test_importing_hora_ray_imports_no_ray() -> None:
    import subprocess
    import sys

    code = "import sys, hora.ray; print([m for m in ('torch', 'tensorflow', 'pyspark', 'ray') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def _reinit_on_ray(offset: int) -> list[tuple[int, int, list[float]]]:
    """init (done by the executor) / allreduce / shutdown / init / allreduce, as a user's function would."""
    seen = []
    for round_number in range(2):
        if round_number:
            hora.shutdown()
            hora.init()  # the next rendezvous round, on the executor's driver service
        total = hora.allreduce(np.array([hora.rank() + offset + round_number], dtype=np.float64), op=hora.Sum)
        seen.append((hora.rank(), hora.size(), total.tolist()))
    return seen


def _port_is_open(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def _driver_port() -> int:
    import os

    return int(os.environ["HORA_DRIVER_ADDR"].rpartition(":")[2])


def test_reinit_in_a_function_keeps_ranks_and_the_service_stops_at_shutdown(ray_cluster) -> None:
    executor = RayExecutor(num_workers=2, cpus_per_worker=0.5, timeout_s=30).start()
    try:
        [port, _] = executor.run(_driver_port)
        for offset in (10, 20):  # twice: the second call's inits join rounds 1 and 2 of the same job
            results = executor.run(_reinit_on_ray, args=(offset,))
            assert results == [[(rank, 2, [2.0 * offset + 1]), (rank, 2, [2.0 * offset + 3])] for rank in range(2)]
        assert _port_is_open(port)  # the service lives as long as the executor
    finally:
        executor.shutdown()
    assert not _port_is_open(port)


def test_horovods_form_with_settings_first(ray_cluster) -> None:
    from hora.ray import RaySettings

    settings = RayExecutor.create_settings(timeout_s=30, ssh_identity_file="~/.ssh/unused")
    assert settings == RaySettings(timeout_s=30.0, placement_group_timeout_s=100.0, interface=None)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=0.5)
    assert (executor.timeout_s, executor.placement_group_timeout_s) == (30.0, 100.0)
    executor.start()
    try:
        assert executor.run(_allreduce_rank, args=(1,)) == [(0, [3.0]), (1, [3.0])]

        def fails_on_rank_1() -> None:
            if hora.rank() == 1:
                raise ValueError("boom on purpose")
            hora.allreduce(np.ones(1))  # must fail, not hang: rank 1 shut its Hora down

        refs = executor.run_remote(fails_on_rank_1)
        with pytest.raises(ray_cluster.exceptions.RayTaskError, match="boom on purpose"):
            ray_cluster.get(refs[1])
        with pytest.raises(ray_cluster.exceptions.RayTaskError, match=r"HoraError|HoraInternalError"):
            ray_cluster.get(refs[0])
    finally:
        executor.shutdown()


def test_settings_are_checked() -> None:
    with pytest.raises(TypeError, match=r"first argument is Horovod's settings .* got 2; give the number of workers"):
        RayExecutor(2)
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match=r"in settings \(create_settings\(timeout_s=...\)\) or timeout_s=, not both"):
        RayExecutor(settings, num_workers=2, timeout_s=5)
    with pytest.raises(ValueError, match=r"one network interface; give nics=\{'eth0'\}, got"):
        RayExecutor.create_settings(nics={"eth0", "eth1"})
    with pytest.raises(ValueError, match=r"timeouts must be positive seconds, got timeout_s=0"):
        RayExecutor.create_settings(timeout_s=0)
    only = RayExecutor(RayExecutor.create_settings(nics={"eth0"}), num_workers=1)
    assert only.env["HORA_NETWORK_INTERFACE"] == "eth0"
    # Horovod's order: settings, num_workers, num_hosts, num_workers_per_host (default 1), cpus_per_worker.
    spread = RayExecutor(settings, None, 2, 3, 0.5)
    assert (spread.num_workers, spread.num_hosts, spread.num_workers_per_host, spread.cpus_per_worker) == (6, 2, 3, 0.5)
    assert RayExecutor(settings, num_hosts=2).num_workers == 2
    with pytest.raises(ValueError, match=r"Give num_workers, or num_hosts \(with num_workers_per_host\), not both"):
        RayExecutor(settings, 4, 2)
