"""Bring-your-own training code on the real local cluster: each preempted for real, each COMPLETED.

Three commands under ``entrypoint: {command: [python, SCRIPT, ...]}`` with the DEFAULT requeue
settings (USR2, no stop_signal given): a script that handles no signal, a torchrun-style DDP
script on 2 nodes that saves on SIGUSR1, and a plain Lightning script on 2 nodes. Each is
preempted by a job in ``urgent`` while training, must be requeued (not FAILED), resume where
it saved, and end COMPLETED with one preemption and no failure in its history.

The scripts sleep a little per step (``--step-time``) instead of burning the shared 2 cores.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import REPO, ByoRun, open_run
from releases import preemption_requeue_via

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def spec(name: str, script: str, nodes: int, steps: int, *args: str) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {
            "partition": "debug",
            "nodes": nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": 1,
            "time": "00:15:00",
        },
        "environment": {"variables": {"OMP_NUM_THREADS": 1}},
        "entrypoint": {
            "command": [
                "python",
                str(REPO / "examples" / "byo" / script),
                "--steps",
                str(steps),
                "--step-time",
                "0.1",
                *args,
            ]
        },
    }


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def preempt_and_finish(run: ByoRun, at_step: int) -> None:
    """Preempt once training passed ``at_step``; release the requeued job; wait for its end."""
    run.wait(f"step {at_step}", lambda: run.steps_done() >= at_step, 300)
    run.preempt()
    run.wait(
        "the preemption in the history",
        lambda: any(e["event"] == "preempted" for e in run.events()),
        60,
    )
    run.release_when_requeued()
    assert run.wait_final() == "COMPLETED", run.log()


def check_history(run: ByoRun, via: str | tuple[str, ...]) -> dict[str, Any]:
    events = run.events()
    names = [e["event"] for e in events]
    assert names.count("preempted") == 1, names
    assert "failure" not in names and "budget_exhausted" not in names, names
    (requeue,) = [e for e in events if e["event"] == "requeue"]  # requeued once
    assert requeue["via"] in ((via,) if isinstance(via, str) else via), requeue
    assert names[-1] == "complete", names
    status = run.status()
    status["requeue_via"] = requeue["via"]
    status["requeue_asked_by"] = requeue.get("asked_by")
    assert status["state"] == "COMPLETED"
    assert "preempted 1x" in status["history"], status
    return status


def restarts(run: ByoRun) -> list[dict[str, Any]]:
    return [p for p in run.progress() if p.get("event") == "start"]


def test_script_that_ignores_signals_is_requeued_and_completes(run: ByoRun) -> None:
    steps = 120
    run.submit(spec("byo-plain-it", "ignores_signals.py", 1, steps, "--save-every", "10"))
    preempt_and_finish(run, at_step=25)
    check_history(run, via=preemption_requeue_via(run.client))
    starts = restarts(run)
    assert [s["restart"] for s in starts] == [0, 1]
    # it resumed from its last periodic save: at most --save-every steps trained again (all
    # ten when the stop came while it saved the step it had just logged: that half-written
    # save is never read)
    stopped_at = max(p["step"] for p in run.progress() if p.get("restart") == 0 and "step" in p)
    assert starts[1]["step"] >= 20 and stopped_at - starts[1]["step"] <= 10
    assert run.steps_done() == steps


def test_torchrun_style_ddp_saves_on_usr1_and_resumes(run: ByoRun) -> None:
    steps = 150
    run.submit(spec("byo-ddp-it", "plain_ddp.py", 2, steps, "--save-every", "1000"))
    preempt_and_finish(run, at_step=20)
    check_history(run, via=preemption_requeue_via(run.client))
    progress = run.progress()
    saved = [p for p in progress if p.get("event") == "saved"]
    assert len(saved) == 1, progress[-5:]  # SIGUSR1 came once, every rank agreed
    starts = restarts(run)
    # resumed exactly where it saved on the signal: no step lost
    assert [s["restart"] for s in starts] == [0, 1] and starts[1]["step"] == saved[0]["step"]
    assert run.steps_done() == steps


def test_torchrun_launch_spans_the_nodes_and_resumes(run: ByoRun) -> None:
    """``command: [torchrun, --nproc-per-node, 2, SCRIPT]`` on 2 nodes, written as by hand: one
    torchrun per node, told the nodes (4 processes, one process group), preempted, resumed
    where it saved on SIGUSR1 (found in torchrun's workers, not torchrun itself)."""
    steps = 150
    script = str(REPO / "examples" / "byo" / "plain_ddp.py")
    job = spec("byo-torchrun-it", "plain_ddp.py", 2, steps, "--save-every", "1000")
    job["resources"].pop("ntasks_per_node")  # one per node: torchrun starts the processes
    job["resources"]["cpus_per_task"] = 2
    job["entrypoint"]["command"] = [
        "torchrun",
        "--nproc-per-node",
        "2",
        script,
        *job["entrypoint"]["command"][2:],
    ]
    run.submit(job)
    preempt_and_finish(run, at_step=20)
    check_history(run, via=preemption_requeue_via(run.client))
    starts = restarts(run)
    assert [(s["restart"], s["world"]) for s in starts] == [(0, 4), (1, 4)], starts
    saved = [p for p in run.progress() if p.get("event") == "saved"]
    assert len(saved) == 1 and starts[1]["step"] == saved[0]["step"], run.progress()[-5:]
    assert run.steps_done() == steps
    assert "--node-rank=1" in run.log(tail=0)  # the second node's torchrun, as it ran


@pytest.mark.long(60)
def test_lightning_script_requeues_itself_once_and_resumes(run: ByoRun) -> None:
    pytest.importorskip("pytorch_lightning", reason="make setup installs the dev dependencies")
    steps = 150
    run.submit(spec("byo-lightning-it", "lightning_train.py", 2, steps))
    preempt_and_finish(run, at_step=20)
    # Lightning 2.x saves hpc_ckpt_N.ckpt INSIDE its SIGUSR1 handler, and that save runs a
    # barrier: every rank gets the signal at the same moment (the supervisors forward it before
    # asking Slurm anything), but a rank already blocked in the gradient all-reduce runs no
    # Python handler, so the other rank's barrier and that all-reduce can wait on each other
    # (about step-skew / step-time of the time; seen on this 2-core machine). Either way the
    # job must be requeued exactly once, run twice and complete, on every release:
    # - handled: Lightning ran `scontrol requeue` itself; ours first on its PATH handed it to
    #   the stop (train.command.selfrequeue): the one requeue is the stop's (ours, or on 24.11+
    #   Slurm's own of the preemption), recorded as asked by the command; trainer.fit restored
    #   hpc_ckpt from RUN_DIR. Without that, 24.11 ran the job a third time after it completed;
    # - deadlocked: our supervisor stopped the command before the partition's GraceTime kill
    #   and requeued it (via "scontrol"), or, when stopping it outlasted the grace, Slurm's
    #   preemption requeued it (via "slurm"); Lightning had saved nothing, so it starts again.
    status = check_history(run, via=("scontrol", "slurm"))
    log = run.log(tail=0)
    handled = log.count("Handling auto-requeue signal")
    assert handled <= 1, log  # rank 0 logs it; never handled twice
    starts = restarts(run)
    assert [s["restart"] for s in starts] == [0, 1]
    assert run.steps_done() == steps
    if status["requeue_asked_by"] == "command":  # Lightning's handler ran and asked
        assert handled == 1, log
        assert "Requeued SLURM job" in log, log  # the requeue it asked for was taken
        assert status["requeue_via"] == preemption_requeue_via(run.client), status
        assert starts[1]["step"] > 0  # trainer.fit restored hpc_ckpt_1.ckpt by itself
        assert list(run.run_dir.glob("hpc_ckpt_*.ckpt"))
    else:
        # the fallback, within the 20 s GraceTime of the local debug partition (20 - 5 s)
        assert "Requeued SLURM job" not in log, log
        assert re.search(r"did not exit 15 s after the stop", log), log
