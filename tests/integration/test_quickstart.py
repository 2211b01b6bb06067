"""README's quick start, command by command, against the real local cluster (issues 19, 45).

The commands are read from the README's "Quick start" block (so the test follows the README when
it changes) and run in order, as written, by bash, from a scratch submission folder that has the
checkout's ``.venv``, ``examples`` and ``sbatch_templates`` beside it. The only additions are the
ones the README itself offers: ``--set train.max_steps=N`` to keep the training short, and the
environment it documents (``SLURM_TRAIN_RUNS_DIR``/``SLURM_TRAIN_STATE_DIR`` so this test's runs
are its own, outside the submission folder). The template lines (``eval "$(... cluster env)"``,
then the filled template piped to ``sbatch``) run in one shell WITHOUT ``SLURM_CONF``: the README
line is what points sbatch at the cluster.
"""

from __future__ import annotations

import getpass
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


def quickstart_commands(readme: str) -> list[str]:
    """The shell lines of the README's quick-start block, comments and `make demo` dropped."""
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README: no ```bash block under ## Quick start"
    commands = []
    for line in block.group(1).splitlines():
        line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if line and line != "make demo":
            commands.append(line)
    return commands


def _run(cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", cmd],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_readme_quickstart_commands_in_order(
    slurm_env: dict[str, str], slurm_client: SlurmClient, tmp_path: Path
) -> None:
    commands = quickstart_commands((REPO / "README.md").read_text())
    assert commands[0] == ".venv/bin/python -m cluster up", commands
    assert commands[-2] == 'eval "$(.venv/bin/python -m cluster env)"', commands
    assert commands[-1].endswith("--dry-run --template ddp | sbatch"), commands

    sub = tmp_path / "submit"  # the submission folder: nothing may be written into it
    sub.mkdir()
    for name in (".venv", "examples", "sbatch_templates"):
        (sub / name).symlink_to(REPO / name)
    before = sorted(p.name for p in sub.iterdir())
    env = dict(slurm_env)
    runs, state = tmp_path / "runs", tmp_path / "state"
    env.update(SLURM_TRAIN_RUNS_DIR=str(runs), SLURM_TRAIN_STATE_DIR=str(state))
    out: dict[str, str] = {}
    err: dict[str, str] = {}

    def run(key: str, cmd: str, environ: dict[str, str]) -> None:
        proc = _run(cmd, sub, environ)
        assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n" + (
            proc.stdout[-3000:] + proc.stderr[-3000:]
        )
        out[key], err[key] = proc.stdout, proc.stderr

    for cmd in commands[:-2]:
        words = shlex.split(cmd)
        if words[2] == "cluster":
            key = "cluster up"
        elif "--dry-run" in words:
            key = "dry-run"
        elif "--follow" in words:
            key, cmd = "follow", f"{cmd} --set train.max_steps={FOLLOW_STEPS}"
        else:
            key = words[3]  # list, status, logs
        run(key, cmd, env)
    # The template lines, in one shell that knows nothing of the cluster but what they say.
    bare = {k: v for k, v in env.items() if k != "SLURM_CONF"}
    fill, _, pipe = commands[-1].rpartition(" | ")
    short = f"{fill} --set train.max_steps={SBATCH_STEPS} | {pipe}"
    run("sbatch", f"{commands[-2]}\n{short}", bare)

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

    # The filled template by plain sbatch: the spec's 2 nodes x 1 task (not the raw 2 x 2).
    job = re.search(r"Submitted batch job (\d+)", out["sbatch"])
    assert job is not None, out["sbatch"]
    jid = job.group(1)
    info = slurm_client.wait_for(jid, timeout=300)
    run_dir = runs / f"cifar-tinycnn-job{jid}"
    batch_log = (run_dir / "slurm" / f"batch-{jid}.out").read_text()
    assert info.state == "COMPLETED", batch_log
    assert "tasks=2" in batch_log and "train exited with 0" in batch_log, batch_log
    assert not Path(f"/tmp/slurm-train-{getpass.getuser()}-{jid}.out").exists()  # moved
    rank_logs = sorted((run_dir / "slurm").glob(f"{jid}_*_log.out"))
    assert [p.name for p in rank_logs] == [f"{jid}_0_log.out", f"{jid}_1_log.out"]
    rank0 = rank_logs[0].read_text()
    assert f"done: {SBATCH_STEPS} steps" in rank0, rank0
    for log in rank_logs:  # no torch warnings from our calls (DDP, global batch norm)
        assert "Warning" not in log.read_text(), log
    # The jobs command line sees the template's run like a submitted one.
    name = f"cifar-tinycnn-job{jid}"
    run("list2", ".venv/bin/python -m jobs list", env)
    assert name in out["list2"], out["list2"]
    run("status2", f".venv/bin/python -m jobs status {name}", env)
    assert "COMPLETED" in out["status2"], out["status2"]
    run("logs2", f".venv/bin/python -m jobs logs {name} --rank 1", env)
    assert "[rank 1]" in out["logs2"], out["logs2"]
    # Nothing new in the submission folder (no logs/, no slurm-*.out, no runs/).
    assert sorted(p.name for p in sub.iterdir()) == before
