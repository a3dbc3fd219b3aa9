"""Several hosts on one machine: network namespaces joined by veth links to a bridge.

Each simulated host is a network namespace with one interface, ``eth0``,
whose peer end is a port of a bridge in a namespace of its own (the
switch). Every link can be rate-limited (``tc`` token bucket, both
directions), so a job sees hosts joined by a network of known speed. The
driver service runs inside host 0's namespace, so no traffic of the job
ever leaves the namespaces made here; they are removed on exit, and
leftovers of a killed run are removed by the next one.

A :class:`LoopbackHost` is one namespace with loopback only, for software
that would otherwise pick the machine's address or bind 0.0.0.0.

Needs root (``ip netns``); :func:`unavailable` says why it cannot run.

    with SimulatedHosts(2, rate_mbit=1000) as hosts:
        outputs = hosts.run_job([0, 0, 1, 1], [sys.executable, "train.py"])

Run as ``python -m tests.netns --driver N ADDRESS`` it is the driver
service of such a job (what :meth:`SimulatedHosts.run_job` starts).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["JobOutput", "LoopbackHost", "SimulatedHosts", "unavailable"]

_PREFIX = "horasim"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, *_tool(args)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


def _tool(args: Sequence[str]) -> list[str]:
    # "tc ..." passes through as a command of its own; anything else is an ip subcommand.
    return list(args) if args and args[0] == "tc" else ["ip", *args]


def unavailable() -> str | None:
    """Why namespaces cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "simulated hosts need root (ip netns)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"simulated hosts need the {tool!r} tool"
    probe = f"{_PREFIX}{os.getpid()}probe"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    return None


def _delete(name: str, timeout: float = 10.0) -> None:
    """Kills every process left in namespace ``name`` (by pid), then deletes the namespace."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
        pids = [int(pid) for pid in listing.stdout.split() if pid.isdigit()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _remove_leftovers() -> None:
    """Deletes the namespaces of earlier runs whose process is gone, and what still runs in them."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _delete(name)


@dataclass(frozen=True)
class JobOutput:
    """One worker's exit status and its combined output."""

    returncode: int
    output: str


class LoopbackHost:
    """One network namespace with nothing but a loopback interface; a context manager.

    For software that finds the machine's address by itself or binds
    0.0.0.0 (Ray on Spark registers its nodes at the host's own address,
    whatever it is told, and its dashboard binds 0.0.0.0): inside, 127.0.0.1
    is the only address there is. Every process still in the namespace on
    exit is killed, daemons included.

        with LoopbackHost() as host:
            subprocess.run(host.command([sys.executable, "job.py"]), timeout=300)
    """

    def __init__(self) -> None:
        self._name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(2)}-lo"
        self._created = False

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self._name, *argv]

    def __enter__(self) -> LoopbackHost:
        _remove_leftovers()
        _ip("netns", "add", self._name)
        self._created = True
        try:
            _ip("link", "set", "lo", "up", namespace=self._name)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._created:
            _delete(self._name)
            self._created = False


class SimulatedHosts:
    """``count`` hosts as network namespaces behind one bridge; a context manager.

    Args:
        count: number of hosts (2-4 keeps jobs small).
        rate_mbit: link speed in Mbit/s each way, or None for unlimited veths.
        mtu: the links' MTU (jumbo frames keep header overhead under 1%).
    """

    def __init__(self, count: int, rate_mbit: float | None = None, mtu: int = 9000) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}.")
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}.")
        self.count = count
        self.rate_mbit = rate_mbit
        self.mtu = mtu
        tag = f"{os.getpid()}-{secrets.token_hex(2)}"
        self._switch = f"{_PREFIX}{tag}-sw"
        self._hosts = [f"{_PREFIX}{tag}-h{i}" for i in range(count)]
        self._subnet = 64 + secrets.randbelow(64)
        self._created: list[str] = []

    def address(self, host: int) -> str:
        """The IPv4 address of ``host``'s ``eth0``."""
        return f"10.{self._subnet}.0.{host + 1}"

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self._hosts[host], *argv]

    def __enter__(self) -> SimulatedHosts:
        _remove_leftovers()
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self) -> None:
        for name in [self._switch, *self._hosts]:
            _ip("netns", "add", name)
            self._created.append(name)
            _ip("link", "set", "lo", "up", namespace=name)
        _ip("link", "add", "br0", "type", "bridge", namespace=self._switch)
        _ip("link", "set", "br0", "up", namespace=self._switch)
        for i, host in enumerate(self._hosts):
            port = f"p{i}"
            _ip("link", "add", "eth0", "netns", host, "mtu", str(self.mtu), "type", "veth", "peer", "name", port,
                "netns", self._switch, "mtu", str(self.mtu), namespace=self._switch)  # fmt: skip
            _ip("link", "set", port, "master", "br0", "up", namespace=self._switch)
            _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", namespace=host)
            _ip("link", "set", "eth0", "up", namespace=host)
            if self.rate_mbit is not None:
                # Both directions: host -> switch on eth0, switch -> host on its port.
                for namespace, device in ((host, "eth0"), (self._switch, port)):
                    _ip("tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{self.rate_mbit:g}mbit",
                        "burst", "256kb", "latency", "100ms", namespace=namespace)  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        for name in reversed(self._created):
            _delete(name)
        self._created.clear()

    def run_job(
        self,
        placement: Sequence[int],
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = 240.0,
        hostnames: Sequence[str] | None = None,
    ) -> list[JobOutput]:
        """Runs ``argv`` as one worker per entry of ``placement`` (the host of each) and returns their outputs.

        Workers on one host report the same host identity (``sim<host>``,
        or ``hostnames[host]``), so they share memory; the driver runs on host 0.
        """
        secret = secrets.token_bytes(32)
        base = dict(os.environ, HORA_SECRET=secret.hex(), **(env or {}))
        driver = subprocess.Popen(
            self.command(0, [sys.executable, "-m", "tests.netns", "--driver", str(len(placement)), self.address(0)]),
            env=base,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        workers: list[subprocess.Popen] = []
        with contextlib.ExitStack() as stack:
            logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in placement]
            try:
                assert driver.stdout is not None
                port = driver.stdout.readline().strip()
                if not port.isdigit():
                    raise RuntimeError(f"the simulated driver did not start: {port!r}")
                for index, host in enumerate(placement):
                    worker_env = dict(
                        base,
                        HORA_DRIVER_ADDR=f"{self.address(0)}:{port}",
                        HORA_WORKER_INDEX=str(index),
                        HORA_HOSTNAME=hostnames[host] if hostnames else f"sim{host}",
                        HORA_BIND_ADDR=self.address(host),
                    )
                    workers.append(
                        subprocess.Popen(
                            self.command(host, list(argv)),
                            env=worker_env,
                            cwd=ROOT,
                            stdout=logs[index],
                            stderr=subprocess.STDOUT,
                        )
                    )
                outputs = []
                for worker, log in zip(workers, logs, strict=True):
                    worker.wait(timeout)
                    log.seek(0)
                    outputs.append(JobOutput(worker.returncode, log.read()))
                return outputs
            finally:
                for process in [*workers, driver]:
                    if process.poll() is None:
                        process.kill()
                    process.communicate()


def _serve_driver(num_workers: int, address: str) -> None:
    """The driver service of a simulated job: prints its port, serves until stdin closes."""
    from hora.driver import DriverService

    secret = bytes.fromhex(os.environ["HORA_SECRET"])
    with DriverService(num_workers, secret, host=address, start_timeout=60) as service:
        print(service.address[1], flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--driver":
        _serve_driver(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit("usage: python -m tests.netns --driver NUM_WORKERS ADDRESS")
