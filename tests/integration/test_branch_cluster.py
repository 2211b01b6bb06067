"""Going back to an older checkpoint, on the real local cluster (issue 29).

The built-in trainer runs to step 60 (checkpoints 40, 50, 60). A batch job then runs
``srun python -m train ... --resume RUN_DIR/checkpoints/step-40`` with ``--requeue``: it starts
branch 1 (``step-N.b1``), is preempted by a job in ``urgent`` and requeued by rank 0. The restart
runs the same command line again; it must continue branch 1 from the checkpoint it saved at the
preemption (not fork from step 40 again, not jump back to the abandoned step 60), prune only
branch 1 (``keep_last: 2``) and end with exactly the parameters of the first run at step 60
(the same schedule: an exact resume). The abandoned ``step-50``/``step-60`` are still there,
unchanged.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_saves
from test_preemption import REPO, SIGNAL_DELAY_S, Cluster

from cluster.hostlist import expand_hostlist
from train.checkpoint import latest_valid, verify_checkpoint
from train.checkpoint.branches import Line, Record, read_record
from train.env import DistEnv
from train.history import RunHistory
from train.spec.config import load_run_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC: dict[str, Any] = {
    "train": {
        "model": "tinycnn",
        "width": 8,
        "data": {"kind": "synthetic", "train_size": 2048, "test_size": 256},
        "max_steps": 60,
        "batch_size": 64,
        "strategy": "single",
        "deterministic": True,
        "num_threads": 1,
        "checkpoint": {"interval_steps": 10, "keep_last": 3, "keep_best": False},
        "log_interval": 5,
    },
    "requeue": {"signal": "USR2", "signal_delay_s": SIGNAL_DELAY_S},
}


@pytest.fixture
def jobs(slurm_client: Any, tmp_path: Path) -> Iterator[Cluster]:
    """Submits this test's jobs and cancels all of them at the end."""
    c = Cluster(slurm_client, tmp_path)
    yield c
    c.cancel_all()


def _submit_resume(cluster: Cluster, spec: Path, run_dir: Path, start: Path) -> str:
    """The resumed run as its user would write it: the explicit checkpoint on the command line
    (so every restart runs it again), saving every 5 steps (a free field), 1.5 s per save phase
    (a save lasts ~6 s: time for a preemption to land while the branch trains)."""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in slow_saves(1.5).items())
    argv = [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run_dir),
            "--set", "train.checkpoint.interval_steps=5", "--set", "train.checkpoint.keep_last=2",
            "--resume", str(start)]  # fmt: skip
    script = cluster.tmp / "resume.sbatch"
    script.write_text(
        f"#!/bin/bash\n{exports}cd {shlex.quote(str(REPO))}\nsrun {shlex.join(argv)}\n"
    )
    args = ["--partition=debug", "--job-name=branch-it", "-n1", "--cpus-per-task=1",
            "--requeue", "--open-mode=append", f"--signal=USR2@{SIGNAL_DELAY_S}", "--time=10",
            f"--output={cluster.tmp / 'slurm-%j.out'}"]  # fmt: skip
    job_id = str(cluster.client.submit(script, args))
    cluster.ids.append(job_id)
    return job_id


def test_a_branch_from_an_older_checkpoint_survives_a_requeue_and_keeps_the_old_one(
    jobs: Cluster, tmp_path: Path
) -> None:
    from train.loop.trainer import run_training

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    first = run_training(load_run_config(spec).train, DistEnv.from_env({}), run_dir)
    assert first.exit_code == 0
    old = {n: verify_checkpoint(root / n)["digest"] for n in ("step-40", "step-50", "step-60")}

    job_id = _submit_resume(jobs, spec, run_dir, root / "step-40")
    jobs.wait("step-45.b1", lambda: (root / "step-45.b1").is_dir(), 240)
    jobs.submit_urgent(expand_hostlist(jobs.job(job_id).get("NodeList", "n1"))[0])
    jobs.run_to_completion(job_id, run_dir, 400)

    events = RunHistory(run_dir).events()
    kinds = [e["event"] for e in events]
    resumes = [e for e in events if e["event"] == "resume"]
    stops = [e for e in events if e["event"] == "preempted"]
    assert kinds[:2] == ["start", "complete"] and kinds[-1] == "complete", kinds
    assert stops and "failure" not in kinds, kinds
    assert Path(resumes[0]["path"]).name == "step-40", resumes
    for stop, resume in zip(stops, resumes[1:], strict=True):
        # the restart continues branch 1 exactly where the stop saved it
        assert Path(resume["path"]).name == f"step-{stop['step']}.b1", (stop, resume)
        assert resume["step"] == stop["step"] > 40, (stop, resume)
    final = latest_valid(root)
    assert final == root / "step-60.b1", final
    assert verify_checkpoint(final)["digest"] == old["step-60"]  # exact: the same parameters
    # the abandoned branch: all there, unchanged; branch 1 pruned to its own newest two
    assert {n: verify_checkpoint(root / n)["digest"] for n in old} == old
    mine = sorted(p.name for p in root.glob("step-*.b1"))
    assert len(mine) == 2 and "step-60.b1" in mine, mine
    assert read_record(root) == Record(Line(1, ((0, 40),)), "step-40")
