"""Fixtures of the launcher tests: a stand-in for ssh."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture
def fake_ssh(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A stand-in for ssh on PATH: drops the options, records the host, runs the command here.

    Like ssh, it passes its standard input to the remote command. Every call's
    whole argument list is also appended to ``ssh.argv`` next to the host log.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh.log"
    script = bin_dir / "ssh"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$@" >> {tmp_path / "ssh.argv"}\n'
        "while [[ $1 == -* ]]; do shift 2; done\n"
        f'echo "$1" >> {log}\n'
        "shift\n"
        'exec bash -c "$*"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    return env, log
