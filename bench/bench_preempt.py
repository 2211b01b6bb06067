"""Preemption on the real local cluster: steps lost per preemption, and restart latency.

A small training job (``srun python -m train``, tiny CNN, one node, both CPUs so nothing else
shares it) runs in partition ``debug`` with ``--requeue`` and ``--signal=USR2@30``. Once it
trains, a job in ``urgent`` asks for the same node: Slurm preempts ours (``PreemptMode=REQUEUE``,
``preempt_send_user_signal``: USR2 reaches train, which checkpoints at the next step boundary and
requeues itself). When the urgent job is done, :meth:`cluster.client.SlurmClient.release` lets
the requeued job start at once; it resumes (``SLURM_RESTART_COUNT`` > 0). Repeated ``cycles``
times, then the job is cancelled.

Read from the run directory afterwards (``metrics.jsonl`` has one line per step here):

- steps lost per preemption = last step completed before the stop - step the resumed run
  starts from (the ``resume`` event); goal 0;
- restart latency = first line of the restarted batch script (a timestamp it writes) to the
  first completed step after the resume, against ``python -c "import torch"`` measured in the
  same run (the floor any restart pays), split into start -> resume (imports, data, checkpoint
  load) and resume -> first step.

Without a cluster, or when the train path fails, the rows say ``skipped: <reason>``.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Figure,
    Goal,
    Options,
    Skip,
    bench_env,
    median,
    run_command,
    skipped,
    wait_until,
)
from train.history import read_jsonl

__all__ = ["run"]

SECTION = "Preemption (local Slurm cluster)"

SPEC = """\
train:
  model: tinycnn
  width: 8
  data: {kind: synthetic, train_size: 2048, test_size: 128}
  batch_size: 64
  max_steps: 100000
  optimizer: {name: sgd, lr: 0.05, schedule: constant}
  checkpoint: {interval_steps: 500, keep_last: 2, keep_best: false}
  log_interval: 1
  eval_every_epochs: 100000
requeue: {signal: USR2, signal_delay_s: 30, max_preemptions: 10}
"""

SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=bench-preempt
#SBATCH --partition=debug
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:15:00
#SBATCH --requeue
#SBATCH --signal=USR2@30
#SBATCH --open-mode=append
#SBATCH --output={run}/slurm-%j.out
# The restart clock starts here: the first line the (re)started batch script runs.
echo "$(date +%s.%N) ${{SLURM_RESTART_COUNT:-0}}" >> {run}/starts.txt
export PYTHONPATH={repo}"${{PYTHONPATH:+:$PYTHONPATH}}"
srun --cpus-per-task=2 --kill-on-bad-exit=1 {python} -m train --config {spec} --run-dir {run}
"""


@dataclass
class Cycle:
    """What one preemption did, read back from the run directory."""

    stop_step: int
    stop_kind: str
    last_done: int
    resume_step: int
    start_to_first_step_s: float
    start_to_resume_s: float
    resume_to_first_step_s: float
    #: seconds per start-up phase, from the resume event (train.startup): process start -> main
    #: -> config -> imports -> process_group -> data_model -> restored
    startup: dict[str, float] = field(default_factory=dict)


class PreemptRun:
    """One training job on the local cluster, preempted ``cycles`` times."""

    def __init__(self, opts: Options, client: Any, run_dir: Path) -> None:
        self.opts, self.client, self.run = opts, client, run_dir
        self.job_id = ""
        self.node = ""

    def train_steps(self) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.run / "metrics.jsonl") if r.get("kind") == "train"]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.run / "events.jsonl") if e.get("event") == name]

    def log_tail(self) -> str:
        logs = sorted(self.run.glob("slurm-*.out"))
        lines = logs[-1].read_text(errors="replace").strip().splitlines() if logs else []
        errors = [ln for ln in lines if "error" in ln.lower()]
        return (errors or lines or ["no log"])[-1][:200]

    def state(self) -> str:
        info = self.client.job_states([self.job_id]).get(self.job_id)
        return info.state if info is not None else "UNKNOWN"

    def alive(self) -> None:
        state = self.state()
        if state in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
            raise Skip(f"training job {self.job_id} ended {state}: {self.log_tail()}")

    def submit(self) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        spec = self.run / "spec.yaml"
        spec.write_text(SPEC, encoding="utf-8")
        script = self.run / "job.sbatch"
        script.write_text(
            SCRIPT.format(
                run=shlex.quote(str(self.run)),
                repo=shlex.quote(str(REPO)),
                python=shlex.quote(sys.executable),
                spec=shlex.quote(str(spec)),
            ),
            encoding="utf-8",
        )
        self.job_id = self.client.submit(script, cwd=self.run)
        self.opts.log(f"preempt: submitted training job {self.job_id}")

        def running() -> str:
            info = self.client.job_states([self.job_id]).get(self.job_id)
            if info is not None and info.terminal:
                raise Skip(f"training job ended {info.state}: {self.log_tail()}")
            return info.nodelist if info is not None and info.state == "RUNNING" else ""

        self.node = wait_until("the training job to start (cluster busy?)", running, 240)

    def wait_steps(self, after: int, count: int = 20) -> None:
        def trained() -> bool:
            self.alive()
            steps = self.train_steps()
            return bool(steps) and int(steps[-1]["step"]) >= after + count

        wait_until(f"step {after + count}", trained, 240)

    def preempt(self, cycle: int) -> None:
        """Urgent job on our node; wait for the requeue; release our job after it."""
        node = self.node
        script = self.run / "urgent.sbatch"
        script.write_text("#!/bin/bash\nsleep 2\n", encoding="utf-8")
        urgent = self.client.submit(
            script,
            [
                "--partition=urgent",
                f"--nodelist={node}",
                "--nodes=1",
                "--ntasks=1",
                "--cpus-per-task=2",
                "--time=2",
                "--job-name=bench-urgent",
                f"--output={self.run}/urgent-%j.out",
            ],
        )
        self.opts.log(f"preempt: urgent job {urgent} on {node} (cycle {cycle})")
        try:
            wait_until(
                "train's requeue after the preemption signal",
                lambda: len(self.events("requeue")) >= cycle,
                120,
            )
            self.client.wait_for(urgent, timeout=120)
        finally:
            self.client.cancel([urgent])

        def released() -> bool:
            state = self.state()
            if state == "RUNNING":
                return True
            if state == "PENDING":
                try:
                    self.client.release(self.job_id)
                except Exception:
                    return False  # not requeued yet; try again
            return False

        wait_until("the requeued job to start again", released, 240, poll=1.0)
        info = self.client.job_states([self.job_id]).get(self.job_id)
        self.node = info.nodelist if info is not None else node

    def first_step_after_resume(self, cycle: int) -> Cycle:
        resume = wait_until(
            f"resume #{cycle}",
            lambda: [e for e in self.events("resume") if e.get("restart_count") == cycle],
            240,
        )[0]
        resume_step, resume_t = int(resume["step"]), float(resume["time"])

        def first() -> dict[str, Any] | None:
            self.alive()
            later = [r for r in self.train_steps() if float(r["time"]) >= resume_t]
            return later[0] if later else None

        first_rec = wait_until("the first step after the resume", first, 240)
        before = [r for r in self.train_steps() if float(r["time"]) < resume_t]
        last_done = int(before[-1]["step"]) if before else 0
        stops = [
            e
            for e in read_jsonl(self.run / "events.jsonl")
            if e.get("event") in ("preempted", "timeout")
        ]
        stop = stops[cycle - 1] if len(stops) >= cycle else {}
        stop_step = int(stop.get("step", -1))
        starts = [ln.split() for ln in (self.run / "starts.txt").read_text().splitlines()]
        start_t = max(float(t) for t, count in starts if int(count) == cycle)
        first_t = float(first_rec["time"])
        return Cycle(
            stop_step=stop_step,
            stop_kind=f"{stop.get('event', '?')}/{stop.get('kind', '?')}",
            last_done=last_done,
            resume_step=resume_step,
            start_to_first_step_s=first_t - start_t,
            start_to_resume_s=resume_t - start_t,
            resume_to_first_step_s=first_t - resume_t,
            startup={
                k: float(v)
                for k, v in (resume.get("startup") or {}).items()
                if isinstance(v, int | float)
            },
        )

    def cancel(self, timeout: float = 90.0) -> None:
        """Cancel the job for good (not requeueable first) and wait until it has ended."""
        if not self.job_id:
            return
        try:
            self.client.cancel([self.job_id], no_requeue=True)
            self.client.wait_for(self.job_id, timeout=timeout)
        except Exception as exc:
            self.opts.log(f"preempt: cancelling {self.job_id}: {exc}")


def _import_torch(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    run_command([sys.executable, "-c", "import torch"], env=env, timeout=120)
    return time.perf_counter() - t0


def _figures(cycles: list[Cycle], floor: list[float], note: str) -> list[Figure]:
    lost = [float(c.last_done - c.resume_step) for c in cycles]
    detail = ", ".join(
        f"{c.stop_kind}: last step {c.last_done}, checkpoint {c.stop_step}, "
        f"resumed at {c.resume_step}"
        for c in cycles
    )
    split = (
        f"start->resume {median([c.start_to_resume_s for c in cycles]):.2f} s, "
        f"resume->first step {median([c.resume_to_first_step_s for c in cycles]):.2f} s"
    )
    phases = [k for k in cycles[-1].startup] if cycles else []
    if phases:  # where the time before the resume went (the last restart's resume event)
        split += " (" + ", ".join(f"{k} {cycles[-1].startup[k]:.2f}" for k in phases) + " s)"
    return [
        Figure.measured(
            SECTION,
            "completed steps lost per preemption",
            "steps",
            lost,
            goal=Goal("<=", 0, on="ours"),
            note=f"{len(cycles)} preemption(s): {detail}; {note}",
        ),
        Figure.measured(
            SECTION,
            "requeued job start -> first training step",
            "s",
            [c.start_to_first_step_s for c in cycles],
            floor,
            baseline_name='python -c "import torch"',
            goal=Goal("<=", 1.3),  # issue 17: a restart pays little beyond importing torch
            note=f"{split}; medians over {len(cycles)} restart(s), floor of {len(floor)} runs",
        ),
    ]


def run(opts: Options) -> list[Figure]:
    """Preempt a training job ``cycles`` times on the local cluster; steps lost, restart time."""
    name = "steps lost / restart latency"
    if not opts.slurm_conf:
        return [skipped(SECTION, name, "no local cluster config (python -m cluster up)")]
    try:
        import train.loop.trainer  # noqa: F401  (the path under test must at least import)
    except Exception as exc:
        return [skipped(SECTION, name, f"train path not importable: {exc}")]
    from cluster import slurm_client

    env = bench_env(threads=None)
    env["SLURM_CONF"] = opts.slurm_conf
    client = slurm_client(environ=env, timeout=30)
    if not client.ping():
        return [skipped(SECTION, name, "no Slurm controller answers (python -m cluster up)")]
    names = {p.name for p in client.partitions()}
    if not {"debug", "urgent"} <= names:
        return [skipped(SECTION, name, f"partitions debug and urgent needed, found {names}")]
    cycles_wanted = 1 if opts.quick else 2
    floor = [_import_torch(env) for _ in range(2)][1:]  # first run warms the page cache
    job = PreemptRun(opts, client, opts.workdir / "preempt")
    cycles: list[Cycle] = []
    try:
        job.submit()
        after = 0
        for k in range(1, cycles_wanted + 1):
            job.wait_steps(after)
            floor.append(_import_torch(env))
            job.preempt(k)
            cycles.append(job.first_step_after_resume(k))
            after = cycles[-1].resume_step
            opts.log(f"preempt: cycle {k}: {cycles[-1]}")
    except Skip as exc:
        if not cycles:
            return [skipped(SECTION, name, str(exc))]
        opts.log(f"preempt: stopped early: {exc}")
    finally:
        job.cancel()
    floor.append(_import_torch(env))
    return _figures(cycles, floor, f"job {job.job_id}, tinycnn w8, batch 64, 2 CPUs")
