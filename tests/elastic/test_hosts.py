"""Elastic horarun's pieces without processes: discovery output, the blacklist and its cooldown, the flags."""

from __future__ import annotations

import pytest
from hora.driver.elastic import HostUpdateResult
from hora.runner.cli import make_parser
from hora.runner.config import ElasticConfig, config_from_args
from hora.runner.discovery import DiscoveryError, HostManager, ScriptDiscovery, parse_discovered


def test_discovered_lines_give_hosts_and_slots_in_order() -> None:
    assert parse_discovered("b:2\n\n a \nc:1\n", 3, "script") == {"b": 2, "a": 3, "c": 1}
    for bad in ("a:x", "a:0", ":2", "a:"):
        with pytest.raises(DiscoveryError, match=f"script printed {bad!r}; expected 'host' or 'host:slots'"):
            parse_discovered(bad, 1, "script")


def test_a_discovery_script_runs_in_the_shell_and_its_failure_is_quoted() -> None:
    assert ScriptDiscovery("printf 'a:2\\nb\\n'", 4)() == {"a": 2, "b": 4}
    with pytest.raises(DiscoveryError, match=r"'echo oops >&2; exit 3' failed with exit code 3: oops"):
        ScriptDiscovery("echo oops >&2; exit 3", 1)()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_host_updates_say_what_changed_among_usable_hosts() -> None:
    hosts = HostManager()
    assert hosts.update({"a": 2}) == HostUpdateResult.added
    assert hosts.update({"a": 2}) == HostUpdateResult.no_update
    assert hosts.update({"a": 2, "b": 1}) == HostUpdateResult.added
    assert hosts.update({"a": 1, "b": 2}) == HostUpdateResult.mixed
    assert hosts.update({"b": 2}) == HostUpdateResult.removed
    assert hosts.available() == {"b": 2}
    assert hosts.describe() == "a:1 (no longer discovered), b:2"


def test_a_blacklisted_host_stays_out_for_good_without_a_cooldown() -> None:
    hosts = HostManager()
    hosts.update({"a": 1, "b": 1})
    assert hosts.blacklist("a") is None
    assert hosts.update({"a": 1, "b": 1}) == HostUpdateResult.no_update
    assert hosts.available() == {"b": 1} and not hosts.may_come_back()
    assert hosts.describe() == "a:1 (blacklisted), b:1"


def test_a_blacklisted_host_comes_back_after_a_cooldown_that_grows_each_time() -> None:
    clock = _Clock()
    hosts = HostManager((10, 100), clock=clock)
    hosts.update({"a": 1, "b": 1})
    first = hosts.blacklist("a")  # Horovod's: MIN * 2**times + U(0, MIN), within [MIN, MAX]
    assert first is not None and 20 <= first <= 30 and hosts.may_come_back()
    clock.now += first - 0.5
    assert hosts.update({"a": 1, "b": 1}) == HostUpdateResult.no_update
    clock.now += 1
    assert hosts.update({"a": 1, "b": 1}) == HostUpdateResult.added
    assert hosts.available() == {"a": 1, "b": 1}
    second = hosts.blacklist("a")
    assert second is not None and 40 <= second <= 50
    for _ in range(3):
        hosts.blacklist("a")
    assert hosts.blacklist("a") == 100  # never more than MAX


def _config(*argv: str):
    return config_from_args(make_parser().parse_args([*argv, "python", "train.py"]))


def test_elastic_flags_make_an_elastic_config_with_horovods_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HORA_ELASTIC_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "42")
    config = _config("-np", "2", "--max-np", "4", "--host-discovery-script", "./hosts.sh", "--slots", "2")
    assert config.num_proc == 2
    assert config.elastic == ElasticConfig(min_np=2, max_np=4, discovery_script="./hosts.sh", slots_per_host=2,
                                           elastic_timeout=42.0)  # fmt: skip
    config = _config("-H", "a:2,b:2", "--min-num-proc", "2", "--reset-limit", "3",
                     "--blacklist-cooldown-range", "5", "60", "--elastic-timeout", "30")  # fmt: skip
    assert config.num_proc == 4
    assert config.elastic == ElasticConfig(min_np=2, reset_limit=3, cooldown_range=(5, 60), elastic_timeout=30.0)
    assert _config("-np", "2").elastic is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("-np", "1", "--min-np", "2", "--max-np", "3"), r"Expected --min-np <= -np <= --max-np, got 2, 1 and 3"),
        (("--min-np", "0"), "--min-np must be at least 1, got 0"),
        (("--max-np", "2", "-np", "3"), r"Expected --min-np <= -np <= --max-np, got 3, 3 and 2"),
        (("--min-np", "1", "--reset-limit", "-1"), "--reset-limit must be >= 0, got -1"),
        (("--min-np", "1", "--blacklist-cooldown-range", "5", "2"), r"expected 1 <= MIN <= MAX <= 3600"),
        (("--min-np", "1", "--elastic-timeout", "0"), "--elastic-timeout must be positive, got 0"),
        (("--host-discovery-script", "x", "-H", "a:1"), "--host-discovery-script finds the hosts; drop -H"),
    ],
)
def test_bad_elastic_flags_are_refused_quoting_them(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(*argv)


class _Stubborn:
    """A worker handle that ignores stop() until killed."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def poll(self) -> int | None:
        return -9 if "kill" in self.calls else None

    def stop(self) -> None:
        self.calls.append("stop")

    def kill(self) -> None:
        self.calls.append("kill")

    def last_lines(self) -> str:
        return ""


def test_a_stopped_worker_that_ignores_it_is_killed_after_its_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    from hora.runner import elastic_job

    monkeypatch.setattr(elastic_job, "_KILL_GRACE_SECONDS", 0.0)
    job = elastic_job.ElasticJob(lambda: {"a": 1}, num_workers=1, min_workers=1, max_workers=1, start_timeout=5,
                                 elastic_timeout=5)  # fmt: skip
    try:
        handle = _Stubborn()
        job._members.by_index[0] = member = elastic_job._Member(handle, 0, "a")
        job.rounds.add(0, "a")
        job._dismiss(member, stop=True)
        job._kill_overdue()
        assert handle.calls == ["stop", "kill"]
        job._kill_overdue()  # once
        assert handle.calls == ["stop", "kill"]
    finally:
        job.service.stop()
