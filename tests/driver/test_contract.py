"""The job contract: what launchers tell a worker, written by WorkerEnv.to_env and read back by from_env."""

from __future__ import annotations

import pytest
from hora.driver.contract import WorkerEnv
from hora.runner.rank_env import rank_variables
from hora.settings import Settings

SECRET = bytes(range(32))


def test_a_contract_round_trips_through_the_environment() -> None:
    place = rank_variables(["a", "b"])[1]
    contract = WorkerEnv(("10.0.0.1", 4000), 7, 45.0, secret=SECRET, bind="0.0.0.0", advertise="10.0.0.2",
                         place=place, elastic_timeout=90.0)  # fmt: skip
    env = contract.to_env()
    assert env["HORA_DRIVER_ADDR"] == "10.0.0.1:4000" and env["HORA_SECRET"] == SECRET.hex()
    assert env["HORA_RANK"] == env["HOROVOD_RANK"] == "1" and env["HORA_ELASTIC"] == "1"
    assert WorkerEnv.from_env(env) == contract
    settings = Settings.from_env(env)  # what hora.init() reads
    assert (settings.driver_address, settings.worker_index, settings.start_timeout) == (("10.0.0.1", 4000), 7, 45.0)
    assert (settings.hostname, settings.bind_host, settings.advertise_host) == ("b", "0.0.0.0", "10.0.0.2")
    assert settings.elastic and settings.elastic_timeout == 90.0


def test_horaruns_contract_leaves_the_secret_out_and_a_fixed_job_is_not_elastic() -> None:
    env = WorkerEnv(("127.0.0.1", 1), 0, 30.0).to_env()
    assert "HORA_SECRET" not in env and "HORA_ELASTIC" not in env  # the guard's stdin carries the secret
    assert WorkerEnv.from_env({**env, "HORA_SECRET": SECRET.hex()}) == WorkerEnv(("127.0.0.1", 1), 0, 30.0, SECRET)
    assert WorkerEnv.from_env({}) == WorkerEnv(None)  # no launcher: a job of its own


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HORA_DRIVER_ADDR": "nowhere"}, "HORA_DRIVER_ADDR='nowhere' is not of the form host:port"),
        ({"HORA_DRIVER_ADDR": "h:1"}, "HORA_DRIVER_ADDR is set but HORA_SECRET is not"),
        ({"HORA_SECRET": "zz"}, "HORA_SECRET is not a hex string"),
        ({"HORA_WORKER_INDEX": "-1"}, "HORA_WORKER_INDEX='-1' is not a non-negative integer"),
        ({"HORA_ELASTIC": "1", "HORA_ELASTIC_TIMEOUT": "soon"}, "HORA_ELASTIC_TIMEOUT='soon' is not a number"),
    ],
)
def test_a_malformed_contract_is_refused_quoting_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkerEnv.from_env(env)
