"""cluster.local.daemons.wait_until: why a daemon is not ready, in one line of its own words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.errors import LocalClusterError
from cluster.local.daemons import wait_until


def test_a_daemon_that_died_is_told_apart_from_a_slow_one(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text("fatal: could not bind\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pid_file = tmp_path / "d.pid"
    pid_file.write_text(f"{dead.pid}\n")
    with pytest.raises(LocalClusterError) as exc:
        wait_until(lambda: False, timeout=30, what="slurmdbd", log=log, pid_file=pid_file)
    first = str(exc.value).splitlines()[0]
    assert first == "slurmdbd exited before it was ready"
    assert "fatal: could not bind" in str(exc.value)

    with pytest.raises(LocalClusterError) as exc:
        wait_until(lambda: False, timeout=0.2, what="slurmdbd", log=log, pid_file=None)
    assert str(exc.value).splitlines()[0] == "slurmdbd did not become ready within 0.2s"
