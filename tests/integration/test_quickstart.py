"""README's quick start, command by command, against the real local cluster (issue 19).

The commands are read from the README's "Quick start" block (so the test follows the README when
it changes) and run in order, as written, from a scratch directory that has the checkout's
``.venv``, ``examples`` and ``sbatch_templates`` beside it. The only additions are the ones the
README itself offers: ``--set train.max_steps=N`` to keep the training short, and the
environment it documents (``SLURM_TRAIN_RUNS_DIR``/``SLURM_TRAIN_STATE_DIR`` so this test's runs
are its own, ``PROJECT_DIR``/``RUN_DIR`` of the sbatch template).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from cluster.client import SlurmClient

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FOLLOW_STEPS = 8
SBATCH_STEPS = 4


def quickstart_commands(readme: str) -> list[list[str]]:
    """The shell commands of the README's quick-start block, comments and `make demo` dropped."""
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README: no ```bash block under ## Quick start"
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words and words[:2] != ["make", "demo"]:
            commands.append(words)
    return commands


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_readme_quickstart_commands_in_order(
    slurm_env: dict[str, str], slurm_client: SlurmClient, tmp_path: Path
) -> None:
    commands = quickstart_commands((REPO / "README.md").read_text())
    programs = [" ".join(c[:4]) for c in commands]
    assert programs[0] == ".venv/bin/python -m cluster up", programs
    assert commands[-1][0] == "sbatch", programs

    for name in (".venv", "examples", "sbatch_templates"):
        (tmp_path / name).symlink_to(REPO / name)
    env = dict(slurm_env)
    env.update(
        SLURM_TRAIN_RUNS_DIR=str(tmp_path / "runs"),
        SLURM_TRAIN_STATE_DIR=str(tmp_path / "state"),
        PROJECT_DIR=str(REPO),
        RUN_DIR=str(tmp_path / "sbatch-run"),
    )
    out: dict[str, str] = {}
    err: dict[str, str] = {}
    for cmd in commands:
        if cmd[0] == "sbatch":
            key, cmd = "sbatch", [*cmd, "--set", f"train.max_steps={SBATCH_STEPS}"]
        elif cmd[2] == "cluster":
            key = "cluster up"
        elif "--dry-run" in cmd:
            key = "dry-run"
        elif "--follow" in cmd:
            key, cmd = "follow", [*cmd, "--set", f"train.max_steps={FOLLOW_STEPS}"]
        else:
            key = cmd[3]  # list, status, logs
        proc = _run(cmd, tmp_path, env)
        assert proc.returncode == 0, f"{shlex.join(cmd)} exited {proc.returncode}:\n" + (
            proc.stdout[-3000:] + proc.stderr[-3000:]
        )
        out[key], err[key] = proc.stdout, proc.stderr

    # cluster up: the three nodes, and the line that points Slurm commands at it.
    assert re.search(r"^export SLURM_CONF=\S+slurm\.conf$", out["cluster up"], re.M)
    assert all(f"node {n}" in out["cluster up"] for n in ("n1", "n2", "n3"))
    # --dry-run: the exact batch script.
    script = out["dry-run"]
    assert script.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in script
    assert "#SBATCH --requeue" in script and "srun" in script
    # --follow: training lines in order, the last line of training names its data, and the
    # final state comes last.
    follow = out["follow"].splitlines()
    run_name = re.search(r"submitted (cifar-tinycnn-\S+);", err["follow"])
    assert run_name is not None, err["follow"]
    done = [line for line in follow if f"done: {FOLLOW_STEPS} steps, test accuracy" in line]
    assert len(done) == 1 and "on SYNTHETIC data, not CIFAR-10" in done[0], out["follow"]
    assert re.search(r"job \d+: COMPLETED$", follow[-1]), follow[-3:]
    # list / status / logs find the run by its name.
    assert run_name.group(1) in out["list"] and "COMPLETED" in out["list"], out["list"]
    assert "COMPLETED" in out["status"] and f"step {FOLLOW_STEPS}" in out["status"]
    assert "[rank 1]" in out["logs"] and "[rank 0]" not in out["logs"], out["logs"]
    # sbatch ddp.sbatch: 2 nodes x 2 tasks with the cluster's dummy GPUs, trained on CPU.
    job = re.search(r"Submitted batch job (\d+)", out["sbatch"])
    assert job is not None, out["sbatch"]
    info = slurm_client.wait_for(job.group(1), timeout=300)
    batch_log = (tmp_path / f"slurm-train-ddp-{job.group(1)}.out").read_text()
    assert info.state == "COMPLETED", batch_log
    assert "tasks=4" in batch_log and "train exited with 0" in batch_log
    rank_logs = sorted((tmp_path / "sbatch-run" / "logs").glob(f"*-{job.group(1)}-rank*.out"))
    assert len(rank_logs) == 4, rank_logs
    rank0 = rank_logs[0].read_text()
    assert "training on CPU (dev cluster" in rank0 and f"done: {SBATCH_STEPS} steps" in rank0
    for log in rank_logs:  # no torch warnings from our calls (DDP, global batch norm)
        assert "Warning" not in log.read_text(), log
