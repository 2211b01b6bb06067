"""A chain of jobs on the real local cluster (issue 48): partition ``cancel`` preempts with
``PreemptMode=CANCEL`` (a preempted job is cancelled, never requeued), so ``jobs submit``
(``requeue.mode`` auto) runs the job as a chain. Preempted twice by a job in ``urgent`` on the
node of the running link, the run goes on in the next links, each resuming from the last
checkpoint, and ends COMPLETED with parameters bitwise equal to the run left alone; the links
still queued are cancelled, and ``jobs status`` shows one run.

Runs are tiny (tinycnn, one task, one thread), paced by a sleep after each step until the test
has preempted twice: the machine has two cores shared by everyone.
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
from jobs.records import load_record
from train.checkpoint import CheckpointManager, verify_checkpoint
from train.env import DistEnv
from train.history import RunHistory
from train.spec.config import load_run_config

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long(240)]

REPO = Path(__file__).resolve().parents[2]
TRAIN: dict[str, Any] = {
    "model": "tinycnn",
    "width": 8,
    "data": {"kind": "synthetic", "train_size": 2048, "test_size": 256},
    "epochs": 5,
    "batch_size": 64,
    "strategy": "single",
    "deterministic": True,
    "num_threads": 1,
    "checkpoint": {"interval_steps": 100, "keep_last": 2},
    "log_interval": 20,
}
SPEC: dict[str, Any] = {
    "name": "chained",
    "resources": {
        "partition": "cancel",
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": 1,
        "time": "00:10:00",
    },
    "train": TRAIN,
    "requeue": {"signal_delay_s": 30},
}


def _final(run_dir: Path) -> tuple[int, str]:
    path = CheckpointManager(run_dir / "checkpoints", rank=1, world_size=1).latest_valid()
    assert path is not None, f"no valid checkpoint in {run_dir}"
    manifest = verify_checkpoint(path)
    return int(manifest["step"]), str(manifest["digest"])


class Chain:
    def __init__(self, env: dict[str, str], client: Any, tmp: Path) -> None:
        self.env, self.client, self.tmp = env, client, tmp
        self.run_dir = Path()
        self.urgent: list[str] = []

    def jobs(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jobs", *args],
            cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def links(self) -> list[str]:
        return load_record(self.run_dir).chain_job_ids

    def events(self) -> list[dict[str, Any]]:
        return RunHistory(self.run_dir).events()

    def log(self) -> str:
        out = [f"events {self.events()}"]
        for path in sorted((self.run_dir / "slurm").glob("*_log.out")):
            out.append(f"== {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def wait(self, what: str, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.log()}"
            time.sleep(1.0)

    def trained_in_link(self, link: int, steps: int) -> bool:
        """Link ``link`` started and its run trained ``steps`` steps past where it started."""
        events = self.events()
        starts = [e for e in events if e["event"] == "link_started"]
        if len(starts) <= link:
            return False
        began = float(starts[link]["time"])
        since = [e for e in events if e["event"] in ("start", "resume") and e["time"] > began]
        if not since:
            return False
        first = int(since[0].get("step") or 0)
        metrics = self.run_dir / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        done = [json.loads(ln) for ln in lines if ln.strip()]
        return any(
            m.get("kind") == "train" and m["time"] > began and m["step"] >= first + steps
            for m in done
        )

    def preempt(self, link: int) -> None:
        """A job in `urgent` that needs all of the node of link ``link``."""
        job_id = self.links()[link]
        node = expand_hostlist(self.client.show_job(job_id)["NodeList"])[0]
        script = self.tmp / "urgent.sbatch"
        script.write_text("#!/bin/bash\nsleep 1\n")
        args = ["--partition=urgent", f"--nodelist={node}", "--exclusive", "--time=1",
                "--job-name=chain-urgent", "--output=/dev/null"]  # fmt: skip
        self.urgent.append(str(self.client.submit(script, args)))

    def cleanup(self) -> None:
        ids = [*self.urgent, *(self.links() if (self.run_dir / "run.json").exists() else [])]
        if ids:
            with contextlib.suppress(Exception):
                self.client.cancel(ids, no_requeue=True)


@pytest.fixture
def chain(env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[Chain]:
    c = Chain(env, slurm_client, tmp_path)
    yield c
    c.cleanup()


def _undisturbed_then_submitted(
    chain: Chain, tmp_path: Path, spec_data: dict[str, Any]
) -> tuple[tuple[int, str], subprocess.CompletedProcess[str]]:
    """The run left alone (its final parameters), then the same spec submitted with paced steps
    (a preemption lands mid-run): (the expected final state, the accepted submission)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data))
    reference = tmp_path / "reference"
    from train.loop.trainer import run_training

    result = run_training(load_run_config(spec).train, DistEnv.from_env({}), reference)
    assert result.exit_code == 0
    pace = tmp_path / "pace"
    chain.env = {**chain.env, **slow_steps(0.25, pace)}
    proc = chain.jobs("submit", str(spec), "--json")
    assert proc.returncode == 0, proc.stderr
    return _final(reference), proc


def test_a_run_preempted_twice_where_preemption_cancels_completes_as_a_chain(
    chain: Chain, tmp_path: Path
) -> None:
    expected, proc = _undisturbed_then_submitted(chain, tmp_path, SPEC)
    assert "PreemptMode is CANCEL" in proc.stderr and "chain of jobs" in proc.stderr
    data = json.loads(proc.stdout)
    chain.run_dir = Path(data["run_dir"])
    first = chain.links()
    assert len(first) == 3 and first[0] == str(data["job_id"])

    for link in (0, 1):
        chain.wait(f"link {link} to train", lambda lk=link: chain.trained_in_link(lk, 15), 240)
        chain.preempt(link)
        chain.wait(f"link {link + 1} to start",
                   lambda lk=link: sum(e["event"] == "link_started" for e in chain.events())
                   > lk + 1, 180)  # fmt: skip
    (tmp_path / "pace").unlink()  # the steps go at full speed again

    chain.wait("the run to complete",
               lambda: any(e["event"] == "chain_ended" for e in chain.events()), 300)  # fmt: skip
    events = chain.events()
    kinds = [e["event"] for e in events]
    assert "complete" in kinds and "failure" not in kinds and "budget_exhausted" not in kinds
    ended = next(e for e in events if e["event"] == "chain_ended")
    assert ended["reason"] == "completed", chain.log()
    starts = [e for e in events if e["event"] == "link_started"]
    links = chain.links()
    assert [e["job_id"] for e in starts] == links[: len(starts)] and len(starts) == 3
    assert len(links) >= 5  # each link that started kept two queued behind it
    assert _final(chain.run_dir) == expected  # bitwise: the same digest at the same step
    # every link that never ran is cancelled, and the run is one COMPLETED run
    chain.wait("the queued links to be cancelled", lambda: all(
        i.terminal for i in chain.client.job_states(links).values()), 60)  # fmt: skip
    proc = chain.jobs("status", links[-1], "--json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["tasks"][0]["state"] == "COMPLETED", status


def test_fastest_cuts_the_requeue_hold_with_a_successor_queued_ahead(
    chain: Chain, tmp_path: Path
) -> None:
    """Issue 46: ``requeue.mode: fastest`` in ``debug`` (``PreemptMode=REQUEUE``, where the
    requeued job would wait Slurm's default 120 s hold in BeginTime): the run goes as a chain;
    a real preemption by a job in ``urgent`` ends link 0 and link 1, queued ahead, starts
    without the hold (never PENDING for BeginTime), resumes from the save the stop made (no
    step lost) and the run completes bitwise equal to the run left alone."""
    spec_data = {
        **SPEC,
        "name": "fastest",
        "resources": {**SPEC["resources"], "partition": "debug"},
        "requeue": {"signal_delay_s": 30, "mode": "fastest"},
    }
    expected, proc = _undisturbed_then_submitted(chain, tmp_path, spec_data)
    assert "a successor queued ahead is back sooner than a requeue here" in proc.stderr
    data = json.loads(proc.stdout)
    chain.run_dir = Path(data["run_dir"])
    record = load_record(chain.run_dir)
    assert record.restart_mode == "chain" and "120 s in BeginTime" in record.restart_reason
    links = chain.links()
    assert len(links) == 3

    chain.wait("link 0 to train", lambda: chain.trained_in_link(0, 15), 240)
    chain.preempt(0)
    # link 1 waits on link 0 (afternotok): never held in BeginTime, as a requeued job is
    reasons: set[str] = set()

    def started() -> bool:
        info = chain.client.poll_states([links[1]]).get(links[1])
        if info is not None and info.state == "PENDING":
            reasons.add(info.reason or "")
        return sum(e["event"] == "link_started" for e in chain.events()) > 1

    chain.wait("link 1 to start", started, 110)  # the hold alone would be 120 s
    assert "BeginTime" not in reasons, reasons
    chain.wait("link 1 to train", lambda: chain.trained_in_link(1, 5), 240)
    (tmp_path / "pace").unlink()  # the steps go at full speed again
    chain.wait("the run to complete",
               lambda: any(e["event"] == "chain_ended" for e in chain.events()), 300)  # fmt: skip
    events = chain.events()
    stop = next(e for e in events if e["event"] == "preempted")
    resumed = [e for e in events if e["event"] == "resume"]
    # no step lost: link 1 resumed from the step link 0 saved at its stop
    assert resumed and resumed[0]["step"] == stop["step"], chain.log()
    # no scontrol requeue: link 0 exited 75 for its successor (recorded as a requeue via chain)
    assert [e.get("via") for e in events if e["event"] == "requeue"] == ["chain"], chain.log()
    ended = next(e for e in events if e["event"] == "chain_ended")
    assert ended["reason"] == "completed", chain.log()
    assert _final(chain.run_dir) == expected
    proc = chain.jobs("status", str(chain.run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "restarts: a successor queued ahead (chain of jobs): requeue.mode: fastest" in (
        proc.stdout
    )
