"""A two-stage pipeline on the real local cluster (issue 48): the training stage is preempted
(a job in ``urgent`` on its node), requeued and resumed; the second stage (a command) starts
only after the first COMPLETED and reads its final checkpoint (``${stages.train.checkpoint}``).

Tiny runs (tinycnn, one task, one thread), paced by a sleep after each step until the test has
preempted: the machine has two cores shared by everyone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.hostlist import expand_hostlist
from train.history import RunHistory

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long(240)]

REPO = Path(__file__).resolve().parents[2]
RESOURCES = {"partition": "debug", "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 1}
PIPELINE: dict[str, Any] = {
    "name": "pipe-it",
    "stages": [
        {
            "name": "train",
            "spec": {
                "resources": {**RESOURCES, "time": "00:10:00"},
                "train": {
                    "model": "tinycnn", "width": 8, "epochs": 3, "batch_size": 64,
                    "data": {"kind": "synthetic", "train_size": 2048, "test_size": 256},
                    "strategy": "single", "deterministic": True, "num_threads": 1,
                    "checkpoint": {"interval_steps": 100, "keep_last": 2}, "log_interval": 20,
                },
                "requeue": {"signal_delay_s": 30},
            },
        },
        {
            "name": "eval",
            "after": "ok",
            "spec": {
                "resources": {**RESOURCES, "time": "00:05:00"},
                "entrypoint": {"command": ["python", "examples/pipeline_eval.py",
                                           "--checkpoint", "${stages.train.checkpoint}"]},
            },
        },
    ],
}  # fmt: skip


class Pipe:
    def __init__(self, env: dict[str, str], client: Any, tmp: Path) -> None:
        self.env, self.client, self.tmp = env, client, tmp
        self.stages: dict[str, dict[str, Any]] = {}
        self.urgent: list[str] = []

    def jobs(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jobs", *args],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def run_dir(self, stage: str) -> Path:
        return Path(self.stages[stage]["run_dir"])

    def events(self, stage: str) -> list[dict[str, Any]]:
        return RunHistory(self.run_dir(stage)).events()

    def info(self, stage: str) -> dict[str, str]:
        try:
            return dict(self.client.show_job(self.stages[stage]["job_id"]))
        except Exception:
            return {}

    def log(self) -> str:
        out = []
        for name in self.stages:
            out.append(f"== {name} events {self.events(name)}")
            for path in sorted((self.run_dir(name) / "slurm").glob("*_log.out")):
                out.append(f"== {path.name}\n{path.read_text(errors='replace')[-2500:]}")
        return "\n".join(out)

    def wait(self, what: str, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.log()}"
            time.sleep(1.0)

    def cleanup(self) -> None:
        ids = [*self.urgent, *(str(s["job_id"]) for s in self.stages.values())]
        if ids:
            with contextlib.suppress(Exception):
                self.client.cancel(ids, no_requeue=True)


@pytest.fixture
def pipe(env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[Pipe]:
    p = Pipe(env, slurm_client, tmp_path)
    yield p
    p.cleanup()


def test_a_two_stage_pipeline_whose_first_stage_is_preempted(pipe: Pipe, tmp_path: Path) -> None:
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(yaml.safe_dump(PIPELINE))
    pace = tmp_path / "pace"
    pipe.env = {**pipe.env, **slow_steps(0.25, pace)}
    proc = pipe.jobs("submit", str(spec), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    pipe.stages = {s["stage"]: s for s in data["stages"]}
    assert list(pipe.stages) == ["train", "eval"]

    def trained(steps: int) -> bool:
        metrics = pipe.run_dir("train") / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return any(json.loads(ln).get("step", 0) >= steps for ln in lines if ln.strip())

    pipe.wait("the training stage to train", lambda: trained(15), 240)
    assert pipe.info("eval").get("JobState") == "PENDING"  # waits on train (afterok)
    node = expand_hostlist(pipe.info("train")["NodeList"])[0]
    script = tmp_path / "urgent.sbatch"
    script.write_text("#!/bin/bash\nsleep 1\n")
    pipe.urgent.append(str(pipe.client.submit(script, [
        "--partition=urgent", f"--nodelist={node}", "--exclusive", "--time=1",
        "--job-name=pipe-urgent", "--output=/dev/null"])))  # fmt: skip

    def requeued() -> bool:
        # held (PENDING, BeginTime), or back already: 26.05's local cluster (--requeue=expedite)
        # brought this preempted stage back in 3.6 s, before a poll saw it PENDING
        info = pipe.info("train")
        return int(info.get("Restarts", "0") or 0) > 0

    pipe.wait("the training stage to be requeued", requeued, 120)
    time.sleep(8)  # Slurm's own BeginTime delay lets the node clean up first
    pipe.client.release(str(pipe.stages["train"]["job_id"]))
    pace.unlink()
    pipe.wait("the training stage to complete",
              lambda: any(e["event"] == "complete" for e in pipe.events("train")), 300)  # fmt: skip
    pipe.wait("the eval stage's output", lambda: (pipe.run_dir("eval") / "eval.json").exists(), 240)

    kinds = [e["event"] for e in pipe.events("train")]
    assert "preempted" in kinds and "resume" in kinds, kinds
    done = next(e for e in pipe.events("train") if e["event"] == "complete")
    out = json.loads((pipe.run_dir("eval") / "eval.json").read_text())
    # the final checkpoint of the training stage, as it completed
    assert out["checkpoint"] == str(pipe.run_dir("train") / "checkpoints" / f"step-{done['step']}")
    assert out["step"] == done["step"], out
    # the second stage started only after the first had ended (afterok)
    ids = [str(pipe.stages[s]["job_id"]) for s in ("train", "eval")]
    times = {a.job_id: a for j in ids for a in pipe.client.attempt_times(j)}
    assert times[ids[1]].start >= times[ids[0]].end, times  # type: ignore[operator]
    proc = pipe.jobs("status", "pipe-it", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["tasks"][0]["state"] == "COMPLETED", rows
