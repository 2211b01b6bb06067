"""cluster.local.daemons.wait_until: why a daemon is not ready, in one line of its own words."""

from __future__ import annotations

import subprocess
import sys
import time
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


def test_a_daemonizing_parents_pid_replaced_by_the_daemons_is_not_a_death(tmp_path: Path) -> None:
    """A daemon's parent may write the pid file before the daemon writes its own pid there: a
    dead pid seen for a moment, then a live one, is a start going on (26.05's slurmctld's
    start was once called dead this way while it ran on)."""
    import threading

    log = tmp_path / "d.log"
    log.write_text("started\n")
    parent = subprocess.Popen([sys.executable, "-c", "pass"])
    parent.wait()
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pid_file = tmp_path / "d.pid"
    pid_file.write_text(f"{parent.pid}\n")
    ready = threading.Event()

    def daemonize() -> None:
        time.sleep(0.3)  # the daemon writes its own pid a moment later
        pid_file.write_text(f"{daemon.pid}\n")
        time.sleep(0.5)
        ready.set()

    threading.Thread(target=daemonize, daemon=True).start()
    try:
        wait_until(ready.is_set, timeout=30, what="slurmctld", log=log, pid_file=pid_file)
    finally:
        daemon.kill()
        daemon.wait()
