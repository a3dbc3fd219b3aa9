"""``horarun --mpi``: the job started by ``mpiexec`` instead of Hora's own launcher.

The workers then rendezvous through MPI (see :mod:`hora.mpi`); horarun only
writes the ``mpiexec`` command line (processes, hosts, the engine settings as
``HORA_*`` variables) for the MPI that mpi4py uses (MPICH's Hydra or Open MPI)
and waits for it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from hora.runner.config import LaunchConfig

__all__ = ["find_mpiexec", "launch_with_mpi", "mpiexec_command"]

_STOP_SECONDS = 10.0  # after Ctrl-C, how long mpiexec gets to stop its ranks before it is killed


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this interpreter (the mpich wheel's), else the first on ``PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise ValueError("horarun --mpi: no mpiexec found beside this Python or on PATH; pip install 'hora[mpi]'.")
    return found


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in version or "OpenRTE" in version


def mpiexec_command(
    config: LaunchConfig, mpiexec: str, open_mpi: bool, exported: Sequence[str], mpi_args: Sequence[str] = ()
) -> list[str]:
    """The command line that starts ``config``'s job under ``mpiexec``.

    ``exported`` names the variables the workers need; Hydra passes the whole
    environment on by itself, Open MPI only what ``-x`` names.
    """
    command = [mpiexec, "-n", str(config.num_proc)]
    if config.hosts:
        listing = ",".join(f"{h.host}:{h.slots}" for h in config.hosts)
        command += ["-H", listing] if open_mpi else ["-hosts", listing]
    if open_mpi:
        for name in exported:
            command += ["-x", name]
    return [*command, *mpi_args, *config.command]


def launch_with_mpi(config: LaunchConfig, mpi_args: str = "", environ: Mapping[str, str] | None = None) -> int:
    """Runs ``config``'s job under ``mpiexec`` and returns its exit code."""
    # mpiexec relays the ranks' output itself: what horarun would do to it cannot be done.
    for flag, given in (("--output-filename", config.output_filename),
                        ("--prefix-output-with-timestamp", config.prefix_output_with_timestamp)):  # fmt: skip
        if given:
            raise ValueError(f"horarun --mpi: {flag} applies to the output horarun relays; mpiexec relays it here.")
    mpiexec = find_mpiexec()
    added = {"HORA_START_TIMEOUT": str(config.start_timeout), **dict(config.engine_env), **dict(config.env)}
    if config.network_interface:
        added["HORA_NETWORK_INTERFACE"] = config.network_interface
    env = {**(os.environ if environ is None else environ), **added}
    command = mpiexec_command(config, mpiexec, _is_open_mpi(mpiexec), sorted(added), shlex.split(mpi_args))
    if config.verbose:
        print("horarun: " + shlex.join(command), file=sys.stderr)
    try:
        process = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise ValueError(f"horarun --mpi: could not start {command[0]}: {exc}") from exc
    try:
        return process.wait()
    except KeyboardInterrupt:  # let mpiexec stop its ranks (remote ones too) before it is killed
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return 130
