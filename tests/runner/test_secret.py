"""Neither the job secret nor the rest of the environment appears on a command line: not in ssh's arguments, not
in any process's cmdline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hora.runner.cli import make_parser
from hora.runner.config import config_from_args
from hora.runner.launch import guarded_argv
from hora.runner.worker import guard_header

from tests.conftest import ROOT
from tests.runner.processes import kill_all, wait_for_pids

SECRET = "ab" * 32


@pytest.mark.parametrize("host", ["nodeb", "localhost"])
def test_a_worker_command_line_holds_no_secret_and_no_environment(host: str) -> None:
    config = config_from_args(make_parser().parse_args(["-H", f"{host}:1", "python", "train.py"]))
    env = {"HORA_SECRET": SECRET, "HORA_DRIVER_ADDR": "10.0.0.1:1234", "AWS_SECRET_ACCESS_KEY": "k" * 40}
    argv = guarded_argv(config, host)
    assert not any(SECRET in arg or "10.0.0.1" in arg or "k" * 40 in arg for arg in argv), argv
    assert "hora.runner.guard" in " ".join(argv) or argv[1].endswith("guard.py")
    header = json.loads(guard_header(bytes.fromhex(SECRET), env, local=host == "localhost"))
    assert header["secret"] == SECRET
    # A remote guard gets the environment in the header (the secret travels as its own field); a local one inherits it.
    assert header["env"] == ({} if host == "localhost" else {k: v for k, v in env.items() if k != "HORA_SECRET"})


def _command_lines() -> dict[int, bytes]:
    lines = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    lines[int(entry)] = cmdline.read()
            except OSError:
                continue
    return lines


@pytest.mark.timeout(90)
def test_the_secret_reaches_local_and_remote_workers_but_no_command_line(
    tmp_path: Path, fake_ssh: tuple[dict[str, str], Path]
) -> None:
    env, _ = fake_ssh
    credential = "cred" + "9" * 40  # another secret of the user's that the launcher's environment holds
    env = dict(env, HORA_TEST_CREDENTIAL=credential)
    release = tmp_path / "release"
    script = (
        "import os, time, pathlib, hora\n"
        "hora.init()\n"
        f"pathlib.Path('{tmp_path}', f'secret.{{hora.rank()}}').write_text(os.environ['HORA_SECRET'])\n"
        f"open('{tmp_path / 'pids'}', 'a').write(f'{{os.getpid()}}\\n')\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists('{release}') and time.monotonic() < deadline: time.sleep(0.05)\n"
    )
    command = [sys.executable, "-m", "hora.runner", "-H", "localhost:1,nodeb:1", "--network-interface", "lo"]
    proc = subprocess.Popen([*command, sys.executable, "-c", script], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen: list[bytes] = []  # every command line on the machine while the job starts and runs
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(tmp_path.glob("secret.*"))) < 2 and proc.poll() is None:
            seen.extend(_command_lines().values())
            time.sleep(0.01)
        pids = wait_for_pids(tmp_path / "pids", 2, timeout=10)
        seen.extend(_command_lines().values())
        release.touch()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        kill_all(pids)
    assert proc.returncode == 0, err
    secrets = {path.read_text() for path in tmp_path.glob("secret.*")}
    assert len(secrets) == 1 and len(next(iter(secrets))) == 64, secrets  # both ranks got the same 32 bytes
    secret = next(iter(secrets)).encode()
    assert len(seen) > 100
    assert not [line for line in seen if secret in line or credential.encode() in line]
    assert secret.decode() not in (tmp_path / "ssh.argv").read_text()
    assert credential not in (tmp_path / "ssh.argv").read_text()
