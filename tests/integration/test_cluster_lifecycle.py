"""``up`` / ``status`` / ``down`` of a second, private cluster (own state dir, shifted ports).

The shared session cluster is never stopped by the tests; this one proves the life cycle: a
second ``up`` changes nothing, a changed config restarts exactly the daemons that read it (a job
running across it survives), and ``down`` leaves no process behind, even with a job running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.client import SlurmClient
from cluster.local import config as cfg
from cluster.local.daemons import pid_alive
from cluster.local.manager import LocalCluster

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
OFFSET = 100


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "cluster", "--state-dir", str(state),
         "--port-offset", str(OFFSET), *args],
        env=env, capture_output=True, text=True, timeout=420, check=False, cwd=REPO,
    )  # fmt: skip


def test_private_cluster_up_twice_then_down_leaves_nothing(
    slurm_cluster: object,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = Path("/var/tmp") / f"slurm-train-lifecycle-{os.getpid()}"
    lc = LocalCluster(state, port_offset=OFFSET)
    try:
        first = _cli(state, "up")
        assert first.returncode == 0, first.stdout + first.stderr
        assert (
            "started: munged, mariadbd, slurmdbd, slurmctld, slurmd-n1, slurmd-n2, slurmd-n3"
            in first.stdout
        )
        second = _cli(state, "up")
        assert second.returncode == 0 and "nothing changed" in second.stdout, second.stdout
        pids = {d.name: d.pid for d in lc.status()}
        assert all(pid_alive(p) for p in pids.values()), pids

        # A job still running at `down` must not survive it either (slurmstepd, its tasks).
        client = SlurmClient(conf=lc.conf)
        tmp = tmp_path_factory.mktemp("lifecycle")
        script = tmp / "sleep.sbatch"
        script.write_text("#!/bin/bash\nsrun sleep 300\n")
        job = client.submit(script, ["-N2", f"--output={tmp}/out"])
        client.wait_for(job, lambda j: j.state == "RUNNING", timeout=60)

        # A hand edit of slurm.conf never reached the daemons: `up` puts the file back, and the
        # daemons already run with what it says, so nothing restarts.
        conf = lc.conf.read_text()
        lc.conf.write_text(conf.replace("MinJobAge=300", "MinJobAge=301"))
        edited = _cli(state, "up")
        assert edited.returncode == 0 and "running daemons already use it" in edited.stdout
        assert lc.conf.read_text() == conf
        assert {d.name: d.pid for d in lc.status()} == pids

        # A new config (as a new version of config.py renders it) reaches every daemon that
        # reads slurm.conf by a restart, slurmctld first; the running job survives it.
        monkeypatch.setattr(cfg, "GRACE_TIME_S", cfg.GRACE_TIME_S + 1)
        res = lc.up()
        monkeypatch.undo()
        slurm_daemons = ["slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3"]
        assert res.restarted == slurm_daemons and res.started == [], res
        assert f"GraceTime={cfg.GRACE_TIME_S + 1}" in lc.conf.read_text()
        after_change = {d.name: d.pid for d in lc.status()}
        assert {n for n in pids if pids[n] != after_change[n]} == set(slurm_daemons)
        assert client.show_job(job)["JobState"] == "RUNNING"
        back = _cli(state, "up")
        assert back.returncode == 0, back.stdout + back.stderr
        assert f"config changed: restarted {', '.join(slurm_daemons)}" in back.stdout
        assert not any(line.startswith("started:") for line in back.stdout.splitlines())
        assert client.show_job(job)["JobState"] == "RUNNING"
        pids = {d.name: d.pid for d in lc.status()}
        again = _cli(state, "up")
        assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout

        status = _cli(state, "status")
        assert status.returncode == 0 and "slurmctld" in status.stdout, status.stdout

        down = _cli(state, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        time.sleep(0.5)
        assert not any(pid_alive(p) for p in pids.values())
        assert lc.leftovers() == []
        after = _cli(state, "status")
        assert after.returncode == 1 and "DOWN" in after.stdout
    finally:
        lc.down()
        subprocess.run(["rm", "-rf", str(state)], check=False, timeout=60)
