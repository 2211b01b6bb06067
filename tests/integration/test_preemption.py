"""Preemption and time limits on the real local Slurm cluster.

A plain batch script runs ``srun python -m train --config SPEC --run-dir DIR`` in ``debug``
with ``--requeue --open-mode=append --signal=USR2@40``:

- preempted by a job in ``urgent`` on the same node: USR2 arrives (preempt_send_user_signal),
  train checkpoints at the next step boundary, rank 0 runs ``scontrol requeue``; released from
  BeginTime, the job resumes at exactly the step it stopped at and ends with the same parameter
  digest as an uninterrupted in-process run;
- with a one-minute time limit: the signal comes before the limit, the stop is recorded as a
  ``timeout``, the job is requeued and completes (again with the reference digest).

Runs are tiny (tinycnn, one task, one thread): the machine has two cores shared by everyone.
Every job submitted here is cancelled at the end.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.hostlist import expand_hostlist
from train.checkpoint import CheckpointManager, verify_checkpoint
from train.env import SLURM_RELEASE_ENV, DistEnv
from train.history import RunHistory
from train.spec.config import load_run_config
from train.stop.facts import requeues_preempted

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SIGNAL_DELAY_S = 40
RELEASE_AFTER_S = 8.0
# 160 optimizer steps of a 5k-parameter CNN (a few seconds of CPU); a job's steps are paced by a
# sleep after each (slow_steps: the parameters do not change) so that it lasts long enough to be
# preempted or to reach the time-limit signal, without burning the CPUs other tests share.
SPEC: dict[str, Any] = {
    "train": {
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
    },
    # a 1-minute job may need several requeues: Slurm sends the time-limit signal at a random
    # point of each restart's first ~20 s (it checks limits every 30 s, up to 60 s early)
    "requeue": {"signal": "USR2", "signal_delay_s": SIGNAL_DELAY_S, "max_timeouts": 30},
}


# The same net as 2 DDP ranks, one per node: 64 steps.
DDP_SPEC: dict[str, Any] = {
    "train": {**SPEC["train"], "strategy": "ddp", "epochs": 2},
    "requeue": SPEC["requeue"],
}


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("preempt-spec") / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


@pytest.fixture(scope="module")
def reference_digest(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run, in this process (same world size: 1)."""
    from train.loop.trainer import run_training

    run_dir = tmp_path_factory.mktemp("preempt-ref")
    result = run_training(load_run_config(spec_path).train, DistEnv.from_env({}), run_dir)
    assert result.exit_code == 0
    return _final(run_dir)[1]


@pytest.fixture(scope="module")
def ddp_spec_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("preempt-ddp-spec") / "spec.yaml"
    path.write_text(yaml.safe_dump(DDP_SPEC))
    return path


def _ddp_reference(spec: Path, run_dir: Path) -> str:
    """The uninterrupted 2-rank run: two local `python -m train` processes (gloo, 127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    procs = []
    for rank in range(2):
        env = {
            **base,
            "PYTHONPATH": str(REPO),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        argv = [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run_dir)]
        procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]
    return _final(run_dir)[1]


def _final(run_dir: Path) -> tuple[int, str]:
    path = CheckpointManager(run_dir / "checkpoints", rank=1, world_size=1).latest_valid()
    assert path is not None, f"no valid checkpoint in {run_dir}"
    manifest = verify_checkpoint(path)
    return int(manifest["step"]), str(manifest["digest"])


class Cluster:
    """Submits jobs for one test and cancels all of them at the end."""

    def __init__(self, client: Any, tmp: Path) -> None:
        self.client = client
        self.tmp = tmp
        self.ids: list[str] = []
        # what jobs submit's preflight exports to the ranks (jobs.render.sbatch_script)
        self.release = client.limits().slurm_version

    def submit_training(
        self,
        spec: Path,
        run_dir: Path,
        options: list[str],
        tasks: tuple[str, ...] = ("-n1",),
        env: dict[str, str] | None = None,
        srun_args: tuple[str, ...] = (),
    ) -> str:
        script = self.tmp / "train.sbatch"
        python = shlex.quote(sys.executable)
        env = {SLURM_RELEASE_ENV: self.release, **(env or {})}
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        srun = shlex.join(["srun", *srun_args])
        script.write_text(
            "#!/bin/bash\n"
            f"{exports}"
            f"cd {shlex.quote(str(REPO))}\n"
            f"{srun} {python} -m train --config {shlex.quote(str(spec))}"
            f" --run-dir {shlex.quote(str(run_dir))}\n"
        )
        args = [
            "--partition=debug",
            "--job-name=ckpt-it",
            *tasks,
            "--cpus-per-task=1",
            "--requeue",
            "--open-mode=append",
            f"--signal=USR2@{SIGNAL_DELAY_S}",
            f"--output={self.tmp / 'slurm-%j.out'}",
            *options,
        ]
        job_id = str(self.client.submit(script, args))
        self.ids.append(job_id)
        return job_id

    def submit_urgent(self, node: str) -> str:
        script = self.tmp / "urgent.sbatch"
        script.write_text("#!/bin/bash\nsleep 5\n")
        args = [
            "--partition=urgent",
            "--job-name=ckpt-it-urgent",
            f"--nodelist={node}",
            "--exclusive",
            "--output=/dev/null",
        ]
        job_id = str(self.client.submit(script, args))
        self.ids.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        try:
            return dict(self.client.show_job(job_id))
        except Exception:
            return {}

    def wait(self, what: str, predicate: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.log()}"
            time.sleep(0.5)

    def log(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in self.tmp.glob("slurm-*.out"))

    def run_to_completion(self, job_id: str, run_dir: Path, timeout_s: float) -> None:
        """Release the job from BeginTime after every requeue until training completes."""
        history = RunHistory(run_dir)
        deadline = time.monotonic() + timeout_s
        pending_since: float | None = None
        while True:
            info = self.job(job_id)
            state = info.get("JobState", "")
            done = any(e["event"] == "complete" for e in history.events())
            if done and state in ("COMPLETED", ""):
                return
            assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), self.log()
            assert not any(e["event"] == "budget_exhausted" for e in history.events())
            if state == "PENDING" and info.get("Reason") == "BeginTime":
                # Released at once, the job can start while the node still cleans up the last
                # run ("Killing non-startable batch job: Job credential revoked" -> FAILED):
                # Slurm's own BeginTime delay exists for that. Give the cleanup a few seconds.
                pending_since = pending_since or time.monotonic()
                if time.monotonic() - pending_since > RELEASE_AFTER_S:
                    with contextlib.suppress(Exception):  # it may just have changed state
                        self.client.release(job_id)
            else:
                pending_since = None
            assert time.monotonic() < deadline, f"job {job_id} did not complete: {self.log()}"
            time.sleep(1.0)

    def cancel_all(self) -> None:
        if self.ids:
            with contextlib.suppress(Exception):
                self.client.cancel(self.ids)


@pytest.fixture
def cluster(slurm_client: Any, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(slurm_client, tmp_path)
    yield c
    c.cancel_all()


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return RunHistory(run_dir).events()


def _check_history(
    events: list[dict[str, Any]], job_id: str, release: str = ""
) -> list[dict[str, Any]]:
    """Common checks; returns the stop events (preempted/timeout) in order.

    Every stop is followed by one requeue and a resume at exactly the stopped step (no
    completed optimizer step lost, none repeated): ours (scontrol), or Slurm's for a
    preemption on a release that requeues preempted jobs itself (24.11+; ``release``: the
    cluster's). Other people's urgent jobs may preempt ours as well on the shared cluster, so
    extra preemptions are allowed.
    """
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "complete", kinds
    assert "failure" not in kinds and "budget_exhausted" not in kinds, events
    stops = [e for e in events if e["event"] in ("preempted", "timeout")]
    resumes = [e for e in events if e["event"] == "resume"]
    requeues = [e for e in events if e["event"] == "requeue"]
    assert stops and len(stops) == len(resumes) == len(requeues), events
    for stop, requeue, resume in zip(stops, requeues, resumes, strict=True):
        slurms = stop["event"] == "preempted" and requeues_preempted(release)
        assert requeue["via"] == ("slurm" if slurms else "scontrol"), (stop, requeue)
        assert requeue["job_id"] == job_id
        assert resume["step"] == stop["step"], (stop, resume)
        assert resume["restart_count"] == stop["restart_count"] + 1
    return stops


@pytest.mark.release_sensitive("a preemption's requeue (24.11+ requeue a preempted job themselves)")
def test_preempted_job_is_requeued_and_resumes_exactly(
    cluster: Cluster, spec_path: Path, reference_digest: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    pace = tmp_path / "pace"  # steps are slow until the preemption is done
    job_id = cluster.submit_training(spec_path, run_dir, ["--time=10"], env=slow_steps(0.1, pace))
    # preempt once training has really started (first metrics line written)
    metrics = run_dir / "metrics.jsonl"
    cluster.wait("training to start", lambda: metrics.exists() and metrics.stat().st_size, 180)
    cluster.submit_urgent(expand_hostlist(cluster.job(job_id).get("NodeList", "n1"))[0])
    cluster.wait(
        "the requeue after preemption",
        lambda: any(e["event"] in ("requeue", "budget_exhausted") for e in _events(run_dir)),
        120,
    )
    pace.unlink()
    cluster.run_to_completion(job_id, run_dir, 300)

    stops = _check_history(_events(run_dir), job_id, cluster.release)
    assert stops[0]["event"] == "preempted" and stops[0]["kind"] == "preemption", stops
    assert all(s["event"] == "preempted" for s in stops)  # --time=10: never a time limit
    assert _final(run_dir)[1] == reference_digest
    assert f"preempted {len(stops)}x" in RunHistory(run_dir).summary()


@pytest.mark.long(125)
def test_time_limit_signal_checkpoints_requeues_and_completes(
    cluster: Cluster, spec_path: Path, reference_digest: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # 160 steps of at least 0.45 s: the run lasts longer than its 1-minute limit, however fast
    # the machine trains, without burning the shared CPUs, so the time-limit signal always comes
    # before its end (usually 15-45 s in; once 53 s was not enough: CI run 22, 24.11 under load).
    # Once the first time-limit stop is requeued, the rest of the run goes at full speed.
    pace = tmp_path / "pace"
    job_id = cluster.submit_training(spec_path, run_dir, ["--time=1"], env=slow_steps(0.45, pace))
    cluster.wait(
        "the requeue before the time limit",
        lambda: any(e["event"] in ("requeue", "budget_exhausted") for e in _events(run_dir)),
        150,
    )
    pace.unlink()
    cluster.run_to_completion(job_id, run_dir, 400)

    stops = _check_history(_events(run_dir), job_id, cluster.release)
    timeouts = [s for s in stops if s["event"] == "timeout"]
    assert stops[0]["event"] == "timeout" and stops[0]["kind"] == "timeout", stops
    assert _final(run_dir)[1] == reference_digest
    assert f"timeout {len(timeouts)}x" in RunHistory(run_dir).summary()


def test_preempted_two_rank_ddp_job_resumes_exactly(
    cluster: Cluster, ddp_spec_path: Path, tmp_path: Path
) -> None:
    """Two ranks on two nodes: both save their part (marker files), meet at the barrier, rank 0
    requeues; the resumed pair ends with the digest of an uninterrupted 2-rank run."""
    run_dir, pace = tmp_path / "run", tmp_path / "pace"
    job_id = cluster.submit_training(
        ddp_spec_path,
        run_dir,
        ["--time=10"],
        tasks=("--nodes=2", "--ntasks-per-node=1"),
        env=slow_steps(0.2, pace),
    )
    metrics = run_dir / "metrics.jsonl"
    cluster.wait("training to start", lambda: metrics.exists() and metrics.stat().st_size, 240)
    cluster.submit_urgent(expand_hostlist(cluster.job(job_id).get("NodeList", "n1"))[0])
    cluster.wait(
        "the requeue after preemption",
        lambda: any(e["event"] in ("requeue", "budget_exhausted") for e in _events(run_dir)),
        120,
    )
    pace.unlink()
    cluster.run_to_completion(job_id, run_dir, 400)

    stops = _check_history(_events(run_dir), job_id, cluster.release)
    assert stops[0]["event"] == "preempted" and stops[0]["kind"] == "preemption", stops
    step, digest = _final(run_dir)
    manifest = verify_checkpoint(run_dir / "checkpoints" / f"step-{step}")
    assert manifest["world_size"] == 2 and {"rank-0.pt", "rank-1.pt"} <= set(manifest["files"])
    assert digest == _ddp_reference(ddp_spec_path, tmp_path / "reference")


@pytest.mark.release_sensitive(
    "a cancel is never requeued, whatever the release does with a signalled job"
)
def test_scancel_checkpoints_and_is_not_requeued(
    cluster: Cluster, spec_path: Path, tmp_path: Path
) -> None:
    """A plain scancel sends SIGTERM too: train checkpoints but must not requeue the job."""
    run_dir = tmp_path / "run"
    job_id = cluster.submit_training(spec_path, run_dir, ["--time=10"], env=slow_steps(0.1))
    metrics = run_dir / "metrics.jsonl"
    cluster.wait("training to start", lambda: metrics.exists() and metrics.stat().st_size, 180)
    cluster.client.cancel([job_id])
    cluster.wait(
        "the cancelled event",
        lambda: any(e["event"] in ("cancelled", "requeue") for e in _events(run_dir)),
        60,
    )
    time.sleep(RELEASE_AFTER_S)  # a requeue would show by now (PENDING with BeginTime)
    state = cluster.job(job_id).get("JobState", "")
    assert state in ("CANCELLED", "COMPLETING", ""), state
    events = _events(run_dir)
    kinds = [e["event"] for e in events]
    assert kinds[-3:] == ["signal", "checkpoint", "cancelled"], events
    assert "requeue" not in kinds and events[-3]["signal"] == "SIGTERM"
    step = events[-1]["step"]
    assert verify_checkpoint(run_dir / "checkpoints" / f"step-{step}")["step"] == step
    assert RunHistory(run_dir).summary() == f"cancelled at step {step}"


# Loaded by every Python of the job through PYTHONPATH (sitecustomize): on rank 1 of the first
# attempt only, training raises at step FAIL_STEP, as an OOM or a bad batch would.
FAIL_STEP = 6
INJECT = f"""
import os

if os.environ.get("SLURM_PROCID") == "1" and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    import train.loop.trainer as trainer

    _step = trainer._Loop.train_step

    def train_step(self, order):
        if self.step == {FAIL_STEP}:
            raise RuntimeError("injected failure on rank 1")
        _step(self, order)

    trainer._Loop.train_step = train_step
"""


def test_failure_on_a_rank_other_than_0_is_requeued_despite_kill_on_bad_exit(
    cluster: Cluster, tmp_path: Path
) -> None:
    """srun --kill-on-bad-exit=1 ends the step as soon as rank 1 exits non-zero, before rank 0
    could learn of the failure: rank 1 records it and requeues the job itself (once: rank 0,
    failing too as its peer is gone, finds the failure already claimed)."""
    spec = tmp_path / "spec.yaml"
    train_cfg = {**DDP_SPEC["train"], "epochs": 2, "checkpoint": {"interval_steps": 4}}
    spec.write_text(yaml.safe_dump({"train": train_cfg, "requeue": {"max_failures": 1}}))
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(INJECT)
    run_dir = tmp_path / "run"
    job_id = cluster.submit_training(
        spec,
        run_dir,
        ["--time=10"],
        tasks=("--nodes=2", "--ntasks-per-node=1"),
        env={"PYTHONPATH": f"{inject}{os.pathsep}{REPO}"},
        srun_args=("--kill-on-bad-exit=1",),
    )
    cluster.wait(
        "the failure's requeue",
        lambda: any(e["event"] in ("requeue", "budget_exhausted") for e in _events(run_dir)),
        240,
    )
    cluster.run_to_completion(job_id, run_dir, 400)

    events = _events(run_dir)
    kinds = [e["event"] for e in events]
    assert kinds == ["start", "failure", "requeue", "resume", "complete"], events
    failure, requeue, resume = events[1], events[2], events[3]
    assert "injected failure on rank 1" in failure["error"] and failure["step"] == FAIL_STEP
    assert requeue["via"] == "scontrol" and requeue["job_id"] == job_id
    assert resume["step"] == 4 and resume["restart_count"] == 1
    assert (run_dir / ".failures" / f"{job_id}-0").is_file()
    assert RunHistory(run_dir).to_dict()["failures"] == 1
