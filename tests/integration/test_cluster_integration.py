"""The local cluster and the Slurm client against real daemons (no mocks)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.client import SlurmClient
from cluster.errors import SlurmCommandError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.release_sensitive(
        "the release's own daemons and commands: sinfo/scontrol outputs, GRES, preemption, "
        "a requeued job's states"
    ),
]

REPO = Path(__file__).resolve().parents[2]


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    return path


def test_up_is_idempotent(slurm_cluster: object, slurm_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cluster", "up"],
        env=slurm_env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "nothing changed" in proc.stdout
    status = subprocess.run(
        [sys.executable, "-m", "cluster", "status"],
        env=slurm_env, capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )  # fmt: skip
    assert status.returncode == 0, status.stdout + status.stderr
    for daemon in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2",
                   "slurmd-n3"):  # fmt: skip
        assert f"{daemon}" in status.stdout
    assert "DOWN" not in status.stdout


def test_shape(slurm_client: SlurmClient) -> None:
    assert slurm_client.ping()
    nodes = {n.name: n for n in slurm_client.nodes()}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert all(n.cpus == 2 and n.gres == {"gpu": 2} and n.usable for n in nodes.values())
    parts = {p.name: p for p in slurm_client.partitions()}
    assert parts["debug"].default and parts["debug"].preempt_mode == "REQUEUE"
    assert parts["urgent"].priority_tier > parts["debug"].priority_tier
    assert parts["debug"].gres_per_node == {"gpu": 2}
    assert parts["debug"].max_time_s == 7200


def test_two_node_srun_lands_ranks_on_both_nodes(slurm_client: SlurmClient, tmp_path: Path) -> None:
    out = tmp_path / "ranks.txt"
    script = _script(
        tmp_path,
        "ranks.sbatch",
        f"srun -N2 --ntasks-per-node=2 bash -c "
        f"'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID $SLURM_NODEID' > {out}\n",
    )
    job = slurm_client.submit(
        script, ["-N2", "--ntasks-per-node=2", f"--output={tmp_path}/%j.out", "-t", "5"]
    )
    info = slurm_client.wait_for(job, timeout=180)
    assert info.state == "COMPLETED", (info, (tmp_path / f"{job}.out").read_text())
    rows = sorted(tuple(line.split()) for line in out.read_text().splitlines())
    # Two distinct nodes (n1, n2 unless the shared cluster is busy: then n3 stands in), ranks
    # 0-1 on the first and 2-3 on the second.
    first, second = rows[0][1], rows[2][1]
    assert first < second
    assert rows == [("0", first, "0", "0"), ("1", first, "1", "0"), ("2", second, "0", "1"),
                    ("3", second, "1", "1")]  # fmt: skip
    # sacct (accounting through slurmdbd) answers for it, in one call with other ids, once
    # slurmdbd has the job's record (until then the controller answers).
    deadline = time.monotonic() + 60
    while True:
        states = slurm_client.job_states([job, "999999"])
        if states[job].source == "sacct" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states[job].state == "COMPLETED" and states[job].source == "sacct"
    assert states[job].exit_code == 0
    assert states[job].nodelist == f"n[{first[1:]}-{second[1:]}]" or states[job].nodelist == (
        f"{first},{second}"
    )
    assert "999999" not in states


def test_gres_is_scheduled_for_real(slurm_client: SlurmClient, tmp_path: Path) -> None:
    script = _script(tmp_path, "gpu.sbatch", 'echo "gpus=$SLURM_GPUS_ON_NODE"\n')
    job = slurm_client.submit(script, ["--gres=gpu:2", "-n1", f"--output={tmp_path}/out.txt"])
    assert slurm_client.wait_for(job, timeout=180).state == "COMPLETED"
    assert "gpus=2" in (tmp_path / "out.txt").read_text()
    with pytest.raises(SlurmCommandError, match="configuration is not available"):
        slurm_client.submit(script, ["--gres=gpu:3", "-n1"])


def test_urgent_preempts_requeue_job_which_can_be_released(
    slurm_client: SlurmClient, tmp_path: Path
) -> None:
    victim_script = _script(
        tmp_path, "victim.sbatch", "echo start ${SLURM_RESTART_COUNT:-0}\nsleep 600\n"
    )
    victim = slurm_client.submit(
        victim_script,
        ["-p", "debug", "--requeue", "-N2", "--ntasks-per-node=2", "-t", "10",
         "--open-mode=append", f"--output={tmp_path}/victim.out"],
    )  # fmt: skip
    try:
        slurm_client.wait_for(victim, lambda j: j.state == "RUNNING", timeout=180)
        urgent_script = _script(tmp_path, "urgent.sbatch", "sleep 2\n")
        urgent = slurm_client.submit(
            urgent_script, ["-p", "urgent", "-N2", "--ntasks-per-node=2", "-t", "5",
                            f"--output={tmp_path}/urgent.out"],
        )  # fmt: skip
        requeued = slurm_client.wait_for(
            victim, lambda j: j.state in {"PENDING", "REQUEUED"}, timeout=120
        )
        assert requeued.state in {"PENDING", "REQUEUED"}
        assert slurm_client.wait_for(urgent, timeout=120).state == "COMPLETED"
        assert slurm_client.show_job(victim)["Restarts"] == "1"
        slurm_client.release(victim)
        slurm_client.wait_for(victim, lambda j: j.state == "RUNNING", timeout=60)
        log = (tmp_path / "victim.out").read_text()
        assert "start 0" in log
    finally:
        slurm_client.cancel([victim])
    assert slurm_client.wait_for(victim, timeout=60).state == "CANCELLED"


def test_cancelled_while_requeued_is_reported_cancelled(
    slurm_client: SlurmClient, tmp_path: Path
) -> None:
    """sacct keeps saying REQUEUED for a requeued job cancelled while pending; squeue is right."""
    script = _script(tmp_path, "requeue.sbatch", "sleep 600\n")
    job = slurm_client.submit(script, ["--requeue", "-n1", "-t", "5", f"--output={tmp_path}/out"])
    try:
        slurm_client.wait_for(job, lambda j: j.state == "RUNNING", timeout=180)
        slurm_client.requeue(job)
        slurm_client.wait_for(job, lambda j: j.state in {"PENDING", "REQUEUED"}, timeout=60)
    finally:
        slurm_client.cancel([job])
    assert slurm_client.wait_for(job, timeout=60).state == "CANCELLED"


def test_spare_node_takes_a_job_kept_off_a_node(slurm_client: SlurmClient, tmp_path: Path) -> None:
    """n3 exists so that a 2-node job can be moved off a bad node (issue 15)."""
    out = tmp_path / "nodes.txt"
    script = _script(tmp_path, "nodes.sbatch", f"srun bash -c 'echo $SLURMD_NODENAME' > {out}\n")
    job = slurm_client.submit(
        script, ["-N2", "-n2", "--exclude=n1", f"--output={tmp_path}/%j.out", "-t", "5"]
    )
    info = slurm_client.wait_for(job, timeout=180)
    assert info.state == "COMPLETED", (info, (tmp_path / f"{job}.out").read_text())
    assert sorted(out.read_text().split()) == ["n2", "n3"]


def test_tasks_know_the_gpus_are_dummies(slurm_client: SlurmClient, tmp_path: Path) -> None:
    """The task prolog marks every task, batch script and srun ranks (issue 19)."""
    from cluster.local.config import DUMMY_GPUS_ENV

    out = tmp_path / "marks.txt"
    script = _script(
        tmp_path,
        "marks.sbatch",
        f'echo "batch ${{{DUMMY_GPUS_ENV}:-unset}}" > {out}\n'
        f"srun bash -c 'echo \"rank $SLURM_PROCID ${{{DUMMY_GPUS_ENV}:-unset}}\"' >> {out}\n",
    )
    job = slurm_client.submit(
        script, ["-N2", "-n2", "--gres=gpu:1", f"--output={tmp_path}/%j.out", "-t", "5"]
    )
    info = slurm_client.wait_for(job, timeout=180)
    assert info.state == "COMPLETED", (info, (tmp_path / f"{job}.out").read_text())
    assert sorted(out.read_text().splitlines()) == ["batch 1", "rank 0 1", "rank 1 1"]
