"""Resume on another shape on the real local cluster (issue 27): ``resources.nodes: "1-2"``.

One DDP run of the built-in trainer (one task per node, a BatchNorm-free model, augmentation on):
started on 2 nodes, preempted by a job in ``urgent`` while the third node is held too, requeued
while only 1 node is free, so Slurm starts it on 1 node, and it resumes there; preempted again
once the other nodes are free, it goes back to 2. ``jobs status`` says ``resumed at step N on 1
node (was 2)``. Every rank records the sample ids it computed per step (tests/hooks,
``train.loop.trainer.BATCH_HOOKS``): the union over ranks and attempts is, step by step, the
uninterrupted 1-rank run's, with no step computed twice and no sample twice in an epoch; the
final parameters are within 1e-5 of that run's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cluster.hostlist import expand_hostlist
from train.env import DistEnv
from train.loop import trainer
from train.loop.trainer import run_training
from train.spec.config import TrainConfig

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import REPO, ByoRun, open_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOOKS = REPO / "tests" / "hooks"
# 8 steps of 256 per epoch; each step sleeps STEP_S after it is done (tests/hooks: the run lasts
# long enough for two preemptions without burning the CPUs other tests share). Short and at a low
# lr on purpose: the sums of 2 ranks and 1 differ in the last bits, and training amplifies any
# difference (at lr 0.05 over 300 steps the two sizes end 4.2 apart, at 0.005 over 250 1e-5)
STEPS = 100
STEP_S = 0.15
TRAIN_SIZE = 2048
TRAIN: dict[str, Any] = {
    "model": "tinycnn",
    "norm": "none",
    "width": 16,
    "data": {"kind": "synthetic", "train_size": TRAIN_SIZE, "test_size": 256, "augment": True},
    "batch_size": 256,
    "max_steps": STEPS,
    "strategy": "ddp",
    "optimizer": {"name": "sgd", "lr": 0.002, "schedule": "constant"},
    "deterministic": True,
    "num_threads": 1,
    "stop_check_s": 0.0,
    "checkpoint": {"interval_steps": 50, "keep_last": 2},
    "log_interval": 10,
    "eval_every_epochs": 25,
}


def spec(samples: Path) -> dict[str, Any]:
    path = os.pathsep.join([str(HOOKS), str(REPO)])
    return {
        "name": "reshape-it",
        "resources": {
            "partition": "debug",
            "nodes": "1-2",
            "ntasks_per_node": 1,
            "cpus_per_task": 1,
            "time": "00:15:00",
        },
        "environment": {
            "variables": {
                "OMP_NUM_THREADS": 1,
                "PYTHONPATH": path,
                "TRAIN_TEST_SAMPLES_DIR": str(samples),
                "TRAIN_TEST_STEP_S": str(STEP_S),
                "TRAIN_TEST_PACE_FILE": str(samples.parent / "pace"),
            }
        },
        "requeue": {"signal": "USR2", "signal_delay_s": 40},
        "train": TRAIN,
    }


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def hold(run: ByoRun, node: str) -> str:
    """A job in ``urgent`` that takes all of ``node`` (preempting ours there) until cancelled."""
    script = run.tmp / "hold.sbatch"
    script.write_text("#!/bin/bash\nsleep 900\n")
    job = str(
        run.client.submit(
            script,
            [
                "--partition=urgent",
                f"--nodelist={node}",
                "--exclusive",
                "--time=20",
                "--job-name=reshape-hold",
                "--output=/dev/null",
            ],
        )
    )
    run.others.append(job)
    run.wait(
        f"the hold on {node}", lambda: run.client.show_job(job).get("JobState") == "RUNNING", 60
    )
    return job


def metrics_step(run: ByoRun) -> int:
    path = run.run_dir / "metrics.jsonl"
    steps = [
        int(json.loads(line).get("step") or 0)
        for line in (path.read_text().splitlines() if path.exists() else [])
        if line.strip()
    ]
    return max(steps, default=0)


def nodes_now(run: ByoRun) -> list[str]:
    info = run.client.show_job(run.job_id)
    if info.get("JobState") != "RUNNING":
        return []
    return expand_hostlist(info["NodeList"])


def resumes(run: ByoRun) -> list[dict[str, Any]]:
    return [e for e in run.events() if e["event"] == "resume"]


def preempt_onto(run: ByoRun, busy: str, before: int) -> dict[str, Any]:
    """Hold ``busy`` (preempting the run), release the requeued run, wait for its next resume."""
    hold(run, busy)
    run.wait(
        "the preemption", lambda: sum(e["event"] == "preempted" for e in run.events()) > before, 120
    )
    run.release_when_requeued()
    run.wait("the resume", lambda: len(resumes(run)) > before, 240)
    return resumes(run)[-1]


def samples(folder: Path) -> dict[int, list[int]]:
    """Step -> sorted sample ids over all ranks and attempts (a stop saves at the step it
    stops at, so no attempt redoes a step: one done twice fails)."""
    per_attempt: dict[str, dict[int, list[int]]] = {}
    for path in sorted(folder.glob("samples-*.jsonl")):
        attempt = path.name.split("-")[1]
        steps = per_attempt.setdefault(attempt, {})
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).extend(rec["ids"])
    out: dict[int, list[int]] = {}
    for steps in per_attempt.values():
        for step, ids in steps.items():
            assert step not in out, f"step {step} was computed by two attempts"
            out[step] = sorted(ids)
    return out


@pytest.mark.long(105)
def test_preempted_on_two_nodes_resumes_on_one_and_back_on_two(run: ByoRun, tmp_path: Path) -> None:
    got_dir, ref_dir = tmp_path / "samples", tmp_path / "ref-samples"
    got_dir.mkdir()
    (tmp_path / "pace").touch()  # steps are slow until the second resume (tests/hooks)
    nodes = sorted(n.name for n in run.client.cluster_state().nodes)
    assert len(nodes) >= 3, nodes
    third = hold(run, nodes[2])  # only 2 nodes for the first start

    def both_idle() -> bool:  # else Slurm starts the range on the 1 node free (it would)
        states = {n.name: n.state for n in run.client.cluster_state().nodes}
        return all(states[n].rstrip("*~#!%$@^-+").upper() == "IDLE" for n in nodes[:2])

    run.wait("2 idle nodes", both_idle, 120)
    run.submit(spec(got_dir))
    run.wait(
        "training on 2 nodes", lambda: len(nodes_now(run)) == 2 and metrics_step(run) >= 20, 300
    )
    first, second = nodes_now(run)
    # preempted on 2 nodes; `second` and `third` are held: only `first` is free for the requeue
    one = preempt_onto(run, second, 0)
    assert (one["world_size"], one["num_nodes"], one["was_world_size"]) == (1, 1, 2), one
    assert one["exact"] is False and one["grad_accum"] == 2, one  # the micro-batch of 128 kept
    assert f"resumed at step {one['step']} on 1 node (was 2)" in run.status()["history"]
    run.wait("training on 1 node", lambda: metrics_step(run) >= one["step"] + 20, 300)
    # back to 2: free the others and hold `first`
    run.client.cancel([j for j in run.others if j != third] + [third], no_requeue=True)
    run.others.clear()
    two = preempt_onto(run, first, 1)
    (tmp_path / "pace").unlink()
    assert (two["world_size"], two["num_nodes"], two["was_world_size"]) == (2, 2, 1), two
    assert run.wait_final(600) == "COMPLETED", run.log()
    assert f"resumed at step {two['step']} on 2 nodes (was 1)" in run.status()["history"]

    # the same run at 1 rank throughout, here (its samples recorded the same way)
    ref_dir.mkdir()
    seen: dict[int, list[int]] = {}
    hook = lambda step, epoch, ids: seen.__setitem__(step, sorted(ids.tolist()))  # noqa: E731
    trainer.BATCH_HOOKS.append(hook)
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        ref = run_training(TrainConfig.model_validate(TRAIN), DistEnv(), ref_dir)
    finally:
        trainer.BATCH_HOOKS.remove(hook)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    assert ref.steps == STEPS and ref.checkpoint is not None

    got = samples(got_dir)
    assert got == seen  # step by step, the same global batches
    epoch0 = [i for s in range(8) for i in got[s]]
    assert len(epoch0) == len(set(epoch0)) == TRAIN_SIZE
    final = run.run_dir / "checkpoints" / f"step-{STEPS}" / "shared.pt"
    a = torch.load(final, weights_only=True)["model"]
    b = torch.load(ref.checkpoint / "shared.pt", weights_only=True)["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
