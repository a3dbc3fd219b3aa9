"""horarun across two simulated hosts (network namespaces): ssh to the other host, and the addresses ranks listen on."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hora.runner.config import ElasticConfig, LaunchConfig
from hora.runner.launch import listen_addresses

from tests import netns
from tests.conftest import ROOT

# Each rank prints the links it has: "tcp" to the rank on the other host, "self" for itself.
SCRIPT = (
    "import numpy as np, hora; hora.init()\n"
    "total = hora.allreduce(np.array([hora.rank() + 1.0]), op=hora.Sum)\n"
    "print('rank', hora.rank(), 'sum', total[0], 'links', hora.basics.current_job().transport_links())\n"
)


def _ssh_into(hosts: netns.SimulatedHosts, directory: Path) -> Path:
    """An ssh stand-in that runs nodeb's command inside host 1's namespace, as ssh would run it there."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(
        "#!/usr/bin/env bash\n"
        "while [[ $1 == -* ]]; do shift 2; done\n"
        'test "$1" = nodeb || { echo "unknown host $1" >&2; exit 255; }\n'
        "shift\n"
        f'exec {shlex.join(hosts.command(1, []))} bash -c "$*"\n'
    )
    ssh.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable()))
@pytest.mark.timeout(120)
def test_a_job_on_two_hosts_connects_over_the_named_interface(tmp_path: Path) -> None:
    with netns.SimulatedHosts(2) as hosts:
        bin_dir = _ssh_into(hosts, tmp_path)
        tools = Path(shutil.which("ip") or "/usr/sbin/ip").parent  # /usr/sbin on some systems
        env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{tools}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
        horarun = [sys.executable, "-m", "hora.runner", "-H", "localhost:1,nodeb:1", "--network-interface", "eth0",
                   "--start-timeout", "60", sys.executable, "-c", SCRIPT]  # fmt: skip
        result = subprocess.run(hosts.command(0, horarun), cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=100)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[0]<stdout>:rank 0 sum 3.0 links ['self', 'tcp']" in result.stdout, result.stdout
    assert "[1]<stdout>:rank 1 sum 3.0 links ['tcp', 'self']" in result.stdout, result.stdout
    assert "Warning" not in result.stdout + result.stderr  # e.g. runpy's, about the remote guard's module


def test_listen_addresses() -> None:
    def config(interface: str | None = None, discovery: str | None = None) -> LaunchConfig:
        elastic = ElasticConfig(min_np=1, discovery_script=discovery) if discovery else None
        return LaunchConfig(num_proc=1, hosts=(), command=("true",), network_interface=interface, elastic=elastic)

    assert listen_addresses(config(), ["localhost", "localhost"]) == ("127.0.0.1", "127.0.0.1")
    # A remote host's ranks must be reachable from the others: every address, on every host.
    assert listen_addresses(config(), ["localhost", "nodeb"]) == ("0.0.0.0", "0.0.0.0")
    # With an interface, each worker binds its own host's address of it (None: resolved by the worker).
    assert listen_addresses(config("lo"), ["nodeb"]) == ("127.0.0.1", None)
    # Hosts a discovery script names may be joined by remote ones later: they must reach everyone.
    assert listen_addresses(config(discovery="./hosts.sh"), ["localhost"]) == ("0.0.0.0", "0.0.0.0")
    assert listen_addresses(config(), []) == ("0.0.0.0", "0.0.0.0")


def test_the_launcher_does_not_load_the_guard() -> None:
    # python -m hora.runner.guard on a remote host imports hora.runner first: runpy warns if that loads the guard.
    import subprocess

    code = "import sys, hora.runner; sys.exit('hora.runner.guard' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
