"""Goodput against the peers on the real local cluster, under one schedule of preemptions.

The same workload for every row (``bench/goodput_work.py``: DDP over gloo, 2 nodes x 1 task,
``STEPS`` steps padded to ``STEP_S`` seconds each), the same schedule: ``PREEMPTIONS`` times,
``AFTER_S`` seconds after the job is seen RUNNING, a job in partition ``urgent`` asks for one of
its nodes (``PreemptMode=REQUEUE``, ``preempt_send_user_signal``: the job's ``--signal`` goes
out, SIGTERM follows after the partition's GraceTime). Every requeue hold is released the same
way for every row: as soon as the job is seen PENDING again, ``scontrol update JobId=..
StartTime=now`` (:meth:`cluster.client.SlurmClient.release`, after its settle of
``SETTLE_S``). Rows:

- ``ours: built-in trainer``: ``python -m jobs submit`` of a spec (tinycnn, synthetic data,
  each step padded by ``bench/goodput_hook``);
- ``ours: entrypoint.command``: the README's recipe for a plain script, under ``jobs submit``;
- ``ours: plain script, no recipe``: the same script with torch's own DDP and optimizer, its
  own ``torch.save``, a flag set by its signal handler (``goodput_work bare``), under
  ``jobs submit``;
- ``Lightning auto_requeue``: plain sbatch, ``srun python ...``, ``--signal=SIGUSR1@90``,
  ``SLURMEnvironment(auto_requeue=True)`` (as its documentation shows);
- ``submitit Checkpointable``: ``submitit.AutoExecutor``, a ``Checkpointable`` that saves in
  ``checkpoint()``;
- ``sbatch trap``: ``#SBATCH --signal=B:USR1@90``, ``trap 'scontrol requeue ...'``, saves
  every ``SAVE_EVERY`` steps;
- ``physical limit``: one uninterrupted run of the workload (plain sbatch, no stop handling)
  plus, per preemption, what no tool avoids: Slurm's own preempt-requeue-restart of a trivial
  job under the same schedule (to its batch script's first line) and ``python -c "import
  torch"``, both measured in this run.

Per row: completed, goodput = STEPS x STEP_S / wall time (from right before the row's own
submission to its last step, the bench's clock: sacct's times are whole seconds; Slurm's Submit
-> End, ``sacct -D``, is in the note), steps redone (step lines written more than once), and the
seconds from each preemption (the urgent job's submission) to the first step after the restart.
The goal: our two rows ahead of every peer and within 10% of the physical limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
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
    wait_idle,
    wait_until,
)
from bench.goodput_hold import MODES, HoldRow, hold_table, run_hold_row
from train.history import read_jsonl

__all__ = ["run"]

SECTION = "Goodput under preemption (local Slurm cluster)"
STEP_S = 0.1
SAVE_EVERY = 50
SETTLE_S = 1.0
#: issue 46: a stopped command's job leaves its nodes "within a few hundred milliseconds" of
#: the command's exit; measured from our records as its requeue after that exit (the slowest)
EXIT_TO_REQUEUE_GOAL_S = 0.5
HOOK = REPO / "bench" / "goodput_hook"


@dataclass(frozen=True)
class Schedule:
    steps: int
    preemptions: int
    after_s: float


@dataclass
class Row:
    name: str
    completed: bool = False
    goodput: float | None = None
    wall_s: float | None = None
    redone: int = 0
    restart_s: list[float] = field(default_factory=list)
    preempted: int = 0
    note: str = ""
    #: per preemption (issue 46): signal -> the job leaves RUNNING (the stop), -> RUNNING again
    #: (Slurm: requeue, the hold released at once, the start), -> the first step (the start);
    #: each as the bench sees it (squeue every 0.25 s)
    split: list[tuple[float, float, float]] = field(default_factory=list)
    #: submit -> the first step of the first attempt
    first_step_s: float | None = None
    #: that first start split: the submission (the bench's clock -> the job id), Slurm and
    #: the launch (-> the process that runs the user's code starts: the user's interpreter
    #: under our supervisor, submitit's ``_submit`` under submitit), the start (-> the first step)
    first_split: tuple[float, float, float] | None = None
    #: a command's stops (issue 46): the requeue's time after the supervisor saw every rank's
    #: command gone (``exited_at`` of its ``requeue`` events): what of the stop is ours
    exit_to_requeue: list[float] = field(default_factory=list)
    #: the limit only: Slurm's restart of a trivial job, and the script with torch's own DDP and
    #: optimizer started by a plain srun (no tool; the uninterrupted run: its process start ->
    #: its first step), the floor of that script's restart that no tool avoids
    trivial_restart_s: float | None = None
    script_start_s: float | None = None
    #: the limit only: Slurm's first start of a trivial job (the bench's clock before its
    #: sbatch -> its first line)
    trivial_first_s: float | None = None


#: The rows that run the script with torch's own DDP and optimizer (goodput_work's ``bare``,
#: ``lightning``, ``trap``, submitit's ``SubmititWork``: not the recipe's ``eager`` ones, not
#: the built-in trainer): the same start as the uninterrupted run's
TORCH_DDP_ROWS = frozenset(
    {"ours: plain script, no recipe", "Lightning auto_requeue", "submitit Checkpointable",
     "sbatch trap"}
)  # fmt: skip


def exit_to_requeue(events: Path) -> list[float]:
    """Per requeue of ours in a run's ``events.jsonl``: its time minus ``exited_at`` (s)."""
    from train.schema import EVENT, read_records

    return [
        round(float(e["time"]) - float(e["exited_at"]), 3)
        for e in read_records(events, EVENT)
        if e.get("event") == "requeue" and e.get("via") == "scontrol" and "exited_at" in e
    ]


class Bench:
    """The cluster, the schedule and the bench's working directory."""

    def __init__(self, opts: Options, client: Any, env: dict[str, str], sched: Schedule) -> None:
        self.opts, self.client, self.env, self.sched = opts, client, env, sched
        self.root = opts.workdir / "goodput"
        self.root.mkdir(parents=True, exist_ok=True)
        #: per job, per preemption: when it was preempted, seen leaving RUNNING, RUNNING again
        self.marks: dict[str, list[dict[str, float]]] = {}
        #: per job: when its submission returned its id (the first start's split)
        self.submitted_at: dict[str, float] = {}

    def state(self, job_id: str) -> tuple[str, str]:
        info = self.client.poll_states([job_id]).get(job_id)
        return (info.state, info.nodelist) if info is not None else ("UNKNOWN", "")

    def sbatch(self, run: Path, body: str, options: list[str]) -> str:
        script = run / "job.sbatch"
        lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in options), body]
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        job = str(self.client.submit(script, cwd=run))
        self.submitted_at[job] = time.time()
        return job

    def urgent(self, node: str, run: Path) -> str:
        script = run / "urgent.sbatch"
        script.write_text("#!/bin/bash\nsleep 1\n", encoding="utf-8")
        return str(
            self.client.submit(
                script,
                [
                    "--partition=urgent",
                    f"--nodelist={node}",
                    "--nodes=1",
                    "--ntasks=1",
                    "--cpus-per-task=2",
                    "--time=2",
                    "--job-name=bench-urgent",
                    f"--output={run}/urgent-%j.out",
                ],
            )
        )

    def drive(self, job_id: str, run: Path, timeout: float) -> list[float]:
        """Apply the schedule to ``job_id``, wait for its end; the preemption times."""
        preempts: list[float] = []
        marks = self.marks.setdefault(job_id, [])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise Skip(f"job {job_id} did not finish in {timeout:.0f} s")
            state, nodes = self.state(job_id)
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"):
                return preempts
            if state == "PENDING" and preempts:
                with contextlib.suppress(Exception):  # not requeued yet: next poll
                    self.client.release(job_id, settle_s=SETTLE_S)
                _wait_not(self, job_id, "PENDING", 30)
                if marks and "back" not in marks[-1]:
                    marks[-1]["back"] = time.time()
                continue
            if state == "RUNNING" and len(preempts) < self.sched.preemptions:
                seen = time.monotonic()
                while time.monotonic() - seen < self.sched.after_s:
                    time.sleep(0.25)
                    state, nodes = self.state(job_id)
                    if state != "RUNNING":
                        break
                if state != "RUNNING":
                    continue
                node = _first_node(nodes)
                preempts.append(time.time())
                urgent = self.urgent(node, run)
                self.opts.log(f"goodput: {run.name}: preempt #{len(preempts)} (urgent {urgent})")
                wait_until(
                    f"job {job_id} to leave RUNNING",
                    lambda: self.state(job_id)[0] != "RUNNING",
                    60,
                    poll=0.25,
                )
                marks.append({"preempt": preempts[-1], "left": time.time()})
                continue
            time.sleep(0.25)

    def row(
        self, name: str, run: Path, job_id: str, preempts: list[float], submitted: float
    ) -> Row:
        """What the run did; its wall time runs from ``submitted`` (the bench's clock right
        before the row's own submission: sbatch, ``jobs submit``, ``executor.submit``) to its
        last step (sub-second: sacct's times are whole seconds; Slurm's span is in the note)."""
        lines = [r for r in read_jsonl(run / "progress.jsonl") if isinstance(r.get("time"), float)]
        steps = [r for r in lines if isinstance(r.get("step"), int) and "event" not in r]
        done = any(r.get("event") == "done" for r in lines)
        attempts = self.client.attempt_times(job_id)
        first = attempts[0].submit if attempts else None
        last = attempts[-1].end if attempts else None
        row = Row(name, preempted=len(preempts))
        distinct = {int(r["step"]) for r in steps}
        ended = attempts[-1].state if attempts else ""
        # every step trained, and the job said so (its last line, or Slurm: the built-in
        # trainer's row writes no "done" line)
        row.completed = max(distinct, default=0) >= self.sched.steps and (
            done or ended == "COMPLETED"
        )
        row.redone = len(steps) - len(distinct)
        if row.completed and steps:
            row.wall_s = max(float(r["time"]) for r in steps) - submitted
            row.goodput = self.sched.steps * STEP_S / row.wall_s
        if steps:
            first_step = min(steps, key=lambda r: float(r["time"]))
            row.first_step_s = float(first_step["time"]) - submitted
            got, began = self.submitted_at.get(job_id), first_step.get("process_start")
            if got is not None and isinstance(began, float):
                row.first_split = (got - submitted, began - got, float(first_step["time"]) - began)
        marks = {m["preempt"]: m for m in self.marks.get(job_id, [])}
        if first is not None and last is not None:
            row.note = f"Slurm: Submit -> End {last - first:.0f} s"
        for i, t in enumerate(preempts):
            later = [float(r["time"]) for r in steps if float(r["time"]) > t]
            # the first step of the next attempt (steps of the stopping attempt come first)
            after = [
                float(r["time"])
                for r in steps
                if float(r["time"]) > t and r.get("attempt", 0) > _attempt_at(steps, t)
            ]
            if after:
                row.restart_s.append(after[0] - t)
                m = dict(marks.get(t, {}))
                # back: Slurm's own start of the next attempt (sacct -D, whole seconds), not
                # the bench's poll, which a loaded machine delays past the first step
                nxt = attempts[i + 1].start if len(attempts) > i + 1 else None
                if nxt is not None and "left" in m:
                    m["back"] = max(m["left"], nxt)
                if "left" in m and "back" in m:
                    row.split.append((m["left"] - t, m["back"] - m["left"], after[0] - m["back"]))
            elif later:
                row.note = "a preemption did not restart the job"
        if not row.completed:
            row.note = row.note or f"did not complete ({len(distinct)} distinct steps)"
        return row


def _attempt_at(steps: list[dict[str, Any]], t: float) -> int:
    before = [int(r.get("attempt", 0)) for r in steps if float(r["time"]) <= t]
    return max(before, default=-1)


def _wait_not(b: Bench, job_id: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and b.state(job_id)[0] == state:
        time.sleep(0.25)


def _first_node(nodelist: str) -> str:
    from cluster.hostlist import expand_hostlist

    try:
        return expand_hostlist(nodelist)[0]
    except Exception:
        return nodelist.split(",")[0]


SBATCH_2x1 = ["--partition=debug", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
              "--time=00:15:00", "--requeue", "--open-mode=append"]  # fmt: skip


def _python() -> str:
    return shlex.quote(sys.executable)


def _exports(run: Path) -> str:
    path = shlex.quote(str(REPO))
    return f"export PYTHONPATH={path}\nexport OMP_NUM_THREADS=1\ncd {shlex.quote(str(run))}\n"


def _work(habit: str, run: Path, steps: int) -> str:
    return (
        f"{_python()} -m bench.goodput_work {habit} {shlex.quote(str(run))} --steps {steps} "
        f"--step-time {STEP_S} --save-every {SAVE_EVERY}"
    )


def row_trap(b: Bench, run: Path) -> tuple[str, list[float]]:
    body = (
        _exports(run) + "trap 'scontrol requeue $SLURM_JOB_ID; exit 0' USR1\n"
        f"srun --kill-on-bad-exit=1 {_work('trap', run, b.sched.steps)} &\nwait\n"
    )
    job = b.sbatch(run, body, [*SBATCH_2x1, "--signal=B:USR1@90", f"--output={run}/out-%j.txt"])
    return job, b.drive(job, run, 600)


def row_lightning(b: Bench, run: Path) -> tuple[str, list[float]]:
    body = _exports(run) + f"srun {_work('lightning', run, b.sched.steps)}\n"
    job = b.sbatch(run, body, [*SBATCH_2x1, "--signal=SIGUSR1@90", f"--output={run}/out-%j.txt"])
    return job, b.drive(job, run, 600)


def row_limit(b: Bench, run: Path) -> tuple[str, list[float]]:
    body = _exports(run) + f"srun --kill-on-bad-exit=1 {_work('nosignal', run, b.sched.steps)}\n"
    job = b.sbatch(run, body, [*SBATCH_2x1, f"--output={run}/out-%j.txt"])
    sched, b.sched = b.sched, Schedule(b.sched.steps, 0, 0.0)
    try:
        return job, b.drive(job, run, 600)
    finally:
        b.sched = sched


def trivial_restarts(b: Bench, run: Path) -> tuple[list[float], float | None]:
    """Slurm's own preempt -> requeue -> restart of a trivial job, to its first line; and its
    first start (the bench's clock right before its sbatch -> its first line)."""
    wait_idle(b.client)
    submitted = time.time()
    body = (
        f"echo $(date +%s.%N) ${{SLURM_RESTART_COUNT:-0}} >> {shlex.quote(str(run))}/starts.txt\n"
        "trap 'scontrol requeue $SLURM_JOB_ID; exit 0' USR1\n"
        f"if [ ${{SLURM_RESTART_COUNT:-0}} -lt {b.sched.preemptions} ]; then sleep 600 & wait; fi\n"
    )
    job = b.sbatch(run, body, [*SBATCH_2x1, "--signal=B:USR1@90", f"--output={run}/out-%j.txt"])
    preempts = b.drive(job, run, 300)
    starts = [ln.split() for ln in (run / "starts.txt").read_text().splitlines() if ln.strip()]
    out = []
    for k, t in enumerate(preempts, 1):
        again = [float(s) for s, n in starts if int(n) == k]
        if again:
            out.append(again[0] - t)
    first = [float(s) for s, n in starts if int(n) == 0]
    return out, (first[0] - submitted if first else None)


def row_submitit(b: Bench, run: Path) -> tuple[str, list[float]]:
    import submitit

    from bench.goodput_work import SubmititWork

    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = b.env["SLURM_CONF"]
    try:
        ex = submitit.AutoExecutor(folder=str(run / "submitit"), cluster="slurm")
        ex.update_parameters(
            nodes=2,
            tasks_per_node=1,
            cpus_per_task=1,
            timeout_min=15,
            slurm_partition="debug",
            slurm_signal_delay_s=90,
            slurm_setup=[f"export PYTHONPATH={shlex.quote(str(REPO))}", "export OMP_NUM_THREADS=1"],
        )
        job = ex.submit(SubmititWork(str(run), b.sched.steps, STEP_S))
        b.submitted_at[str(job.job_id)] = time.time()
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
    return str(job.job_id), b.drive(str(job.job_id), run, 600)


OURS_SPEC = """\
name: goodput-{what}
resources: {{partition: debug, nodes: 2, ntasks_per_node: 1, cpus_per_task: 1, time: "00:15:00"}}
environment:
  variables: {{OMP_NUM_THREADS: 1, BENCH_STEP_S: "{step_s}", PYTHONPATH: "{pythonpath}"}}
requeue: {{signal: USR2, signal_delay_s: 90, max_preemptions: 20{mode}}}
"""
OURS_TRAIN = """\
train:
  model: tinycnn
  width: 4
  data: {{kind: synthetic, train_size: 512, test_size: 32}}
  batch_size: 16
  max_steps: {steps}
  optimizer: {{name: sgd, lr: 0.05, schedule: constant}}
  checkpoint: {{interval_steps: {save_every}, keep_last: 2, keep_best: false}}
  log_interval: 1000000
  eval_every_epochs: 1000000
"""
OURS_COMMAND = """\
entrypoint:
  command: [{python}, -m, bench.goodput_work, {habit}, "{run}", --steps, "{steps}",
            --step-time, "{step_s}"]
  stop_signal: USR1
"""


def _ours_spec(b: Bench, run: Path, what: str, mode: str | None = None) -> str:
    """The spec of one of our rows (``mode``: its ``requeue.mode``, else the default)."""
    text = OURS_SPEC.format(
        what=what, step_s=STEP_S, pythonpath=f"{HOOK}:{REPO}",
        mode=f", mode: {mode}" if mode else "",
    )  # fmt: skip
    if what == "trainer":
        return text + OURS_TRAIN.format(steps=b.sched.steps, save_every=SAVE_EVERY)
    habit = "bare" if what == "bare" else "plain"
    return text + OURS_COMMAND.format(
        python=sys.executable, habit=habit, run=run / "task", steps=b.sched.steps, step_s=STEP_S
    )


def submit_spec(b: Bench, run: Path, text: str) -> tuple[str, Path]:
    """``jobs submit`` of the spec ``text`` (written to ``run/spec.yaml``) as a user would:
    (its job id, its run directory); Skip with the command's last line when it refuses."""
    spec = run / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", "submit", str(spec), "--json", "--runs-dir", str(run)],
        env=b.env, cwd=str(REPO), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise Skip(f"jobs submit: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    sub = json.loads(proc.stdout.strip().splitlines()[-1])
    b.submitted_at[str(sub["job_id"])] = time.time()
    return str(sub["job_id"]), Path(sub["run_dir"])


def _ours(b: Bench, run: Path, what: str) -> tuple[str, list[float]]:
    job, run_dir = submit_spec(b, run, _ours_spec(b, run, what))
    if what != "trainer":
        (run / "task").mkdir(exist_ok=True)
        link = run / "task"
    else:
        link = run_dir
    preempts = b.drive(job, run, 600)
    if link != run:
        src = link / "progress.jsonl"
        if src.exists():
            (run / "progress.jsonl").write_bytes(src.read_bytes())
    (run / "ours_run_dir").write_text(str(run_dir), encoding="utf-8")
    # our own ledger of the same run (jobs status's line), beside the bench's measure
    from jobs.goodputview import dir_ledger

    ledger = dir_ledger(run_dir, lambda: b.client)
    (run / "ledger.json").write_text(json.dumps(ledger.to_dict()), encoding="utf-8")
    keep = b.opts.workdir.parent / "goodput-runs" / run.name  # the report's dir: kept
    keep.mkdir(parents=True, exist_ok=True)
    for name in ("events.jsonl", "metrics.jsonl", "ledger.json", "progress.jsonl"):
        for src in (run_dir / name, run / name):
            if src.is_file():
                (keep / name).write_bytes(src.read_bytes())
    b.opts.log(f"goodput: {run.name}: jobs status says {ledger.line()}: {ledger.to_dict()}")
    return job, preempts


def _import_torch(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    run_command([sys.executable, "-c", "import torch"], env=env, timeout=120)
    return time.perf_counter() - t0


ROWS: dict[str, Callable[[Bench, Path], tuple[str, list[float]]]] = {
    "ours: built-in trainer": lambda b, r: _ours(b, r, "trainer"),
    "ours: entrypoint.command": lambda b, r: _ours(b, r, "command"),
    # issue 46: a plain script that follows no recipe of ours (torch's DDP and optimizer)
    "ours: plain script, no recipe": lambda b, r: _ours(b, r, "bare"),
    "Lightning auto_requeue": row_lightning,
    "submitit Checkpointable": row_submitit,
    "sbatch trap": row_trap,
}


def _table(rows: list[Row], limit: Row) -> str:
    head = (
        "| row | completed | goodput | wall s | steps redone | preemption -> training (s) "
        "| per preemption: stop / Slurm / start (s) | submit -> first step (s) "
        "| first start: submit / Slurm and launch / start (s) | command exit -> requeued (s) |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in [*rows, limit]:
        g = f"{r.goodput:.3f}" if r.goodput is not None else "-"
        w = f"{r.wall_s:.0f}" if r.wall_s is not None else "-"
        rs = ", ".join(f"{x:.1f}" for x in r.restart_s) or "-"
        sp = "; ".join(" / ".join(f"{x:.1f}" for x in parts) for parts in r.split) or "-"
        fs = f"{r.first_step_s:.1f}" if r.first_step_s is not None else "-"
        fsp = " / ".join(f"{x:.2f}" for x in r.first_split) if r.first_split else "-"
        ex = ", ".join(f"{x:.2f}" for x in r.exit_to_requeue) or "-"
        out.append(
            f"| {r.name} | {'yes' if r.completed else 'no'} | {g} | {w} | {r.redone} | {rs} "
            f"| {sp} | {fs} | {fsp} | {ex} |"
        )
    return "\n".join(out)


def run(opts: Options) -> list[Figure]:
    """Every row under the same schedule, one after another; figures against the peers."""
    name = "goodput vs peers"
    if not opts.slurm_conf:
        return [skipped(SECTION, name, "no local cluster config (python -m cluster up)")]
    from cluster import slurm_client

    env = bench_env(threads=None)
    env["SLURM_CONF"] = opts.slurm_conf
    client = slurm_client(environ=env, timeout=30)
    if not client.ping():
        return [skipped(SECTION, name, "no Slurm controller answers (python -m cluster up)")]
    sched = Schedule(steps=300, preemptions=2, after_s=15.0) if opts.quick else Schedule(
        steps=int(os.environ.get("BENCH_GOODPUT_STEPS", "600")), preemptions=3, after_s=15.0
    )  # fmt: skip
    only = [s for s in os.environ.get("BENCH_GOODPUT_ROWS", "").split(",") if s]
    b = Bench(opts, client, env, sched)
    rows: list[Row] = []
    for i, (row_name, start) in enumerate(ROWS.items()):
        if only and not any(o in row_name for o in only):
            continue
        run_dir = b.root / f"row{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        job = ""
        try:
            # every row starts on idle nodes: the row before's job may still be completing
            # there, which Slurm's start of this one would wait for (3 s against 1 s seen)
            wait_idle(client)
            submitted = time.time()
            job, preempts = start(b, run_dir)
            rows.append(b.row(row_name, run_dir, job, preempts, submitted))
            kept = opts.workdir.parent / "goodput-runs" / run_dir.name / "events.jsonl"
            if kept.is_file():  # our rows keep their events; only a command's carry exited_at
                rows[-1].exit_to_requeue = exit_to_requeue(kept)
            if (run_dir / "ledger.json").exists():
                led = json.loads((run_dir / "ledger.json").read_text(encoding="utf-8"))
                said = f"jobs status: goodput {led['goodput']}, parts {led['parts_s']}"
                rows[-1].note = "; ".join(n for n in (rows[-1].note, said) if n)
        except Exception as exc:
            rows.append(Row(row_name, note=f"error: {exc}"[:200]))
        finally:
            if job:
                with contextlib.suppress(Exception):
                    client.cancel([job], no_requeue=True)
        opts.log(f"goodput: {rows[-1]}")
    # the hold as users meet it: a plain script preempted once under each mode, nothing released
    holds: list[HoldRow] = []
    for i, row_name in enumerate(MODES):
        if only and not any(o in row_name for o in only):
            continue
        run_dir = _mkdir(b.root / f"hold{i}")
        (run_dir / "task").mkdir(exist_ok=True)
        text = _ours_spec(b, run_dir, "bare", MODES[row_name])
        try:
            holds.append(run_hold_row(b, run_dir, row_name, text))
        except Exception as exc:
            holds.append(HoldRow(row_name, MODES[row_name], note=f"error: {exc}"[:200]))
        opts.log(f"goodput: {holds[-1]}")
    # the physical limit: one uninterrupted run + what no tool avoids per preemption
    limit = Row("physical limit")
    floor = [_import_torch(env) for _ in range(2)][1:]
    try:
        wait_idle(client)
        submitted = time.time()
        job, _ = row_limit(b, _mkdir(b.root / "limit"))
        base = b.row("uninterrupted", b.root / "limit", job, [], submitted)
        opts.log(f"goodput: {base}")
        trivial, trivial_first = trivial_restarts(b, _mkdir(b.root / "trivial"))
        floor.append(_import_torch(env))
        t_restart, t_torch = median(trivial), median(floor)
        if base.wall_s is not None and t_restart is not None and t_torch is not None:
            per = t_restart + t_torch
            limit.wall_s = base.wall_s + sched.preemptions * per
            limit.goodput = sched.steps * STEP_S / limit.wall_s
            limit.completed = True
            limit.restart_s = [per]
            limit.trivial_restart_s = t_restart
            limit.script_start_s = base.first_split[2] if base.first_split else None
            limit.note = (
                f"uninterrupted {base.wall_s:.0f} s + {sched.preemptions} x (Slurm restart of "
                f"a trivial job {t_restart:.1f} s + import torch {t_torch:.1f} s)"
            )
        if trivial_first is not None and t_torch is not None:
            # the first start's floor: Slurm's start of a trivial job + import torch
            limit.first_step_s = trivial_first + t_torch
            limit.trivial_first_s = trivial_first
            limit.note += (
                f"; first start: Slurm's start of a trivial job {trivial_first:.1f} s + import "
                f"torch {t_torch:.1f} s"
            )
    except Exception as exc:
        limit.note = f"error: {exc}"[:200]
    wait_idle(client)  # every job of this section has left before the bench removes its folder
    table = _table(rows, limit)
    if holds:
        table += "\n\n" + hold_table(holds)
    opts.log("goodput:\n" + table)
    (opts.workdir.parent / "goodput.md").write_text(table + "\n", encoding="utf-8")
    return _figures(rows, limit, sched) + _hold_figures(holds, limit)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _figures(rows: list[Row], limit: Row, sched: Schedule) -> list[Figure]:
    note_s = (
        f"{sched.steps} steps x {STEP_S} s, 2 nodes x 1 task (gloo), {sched.preemptions} "
        f"preemptions {sched.after_s:.0f} s into each attempt; every requeue hold released at "
        f"once ({SETTLE_S:.0f} s settle) for every row"
    )
    figures = []
    peers = [r for r in rows if not r.name.startswith("ours") and r.goodput is not None]
    best = max(peers, key=lambda r: r.goodput or 0.0, default=None)
    base = [limit.goodput] if limit.goodput is not None else None
    for r in rows:
        detail = (
            f"completed {'yes' if r.completed else 'no'}, steps redone {r.redone}, "
            f"preemption -> training {', '.join(f'{x:.1f}' for x in r.restart_s) or '-'} s"
            + (f"; {r.note}" if r.note else "")
        )
        if r.goodput is None:
            figures.append(skipped(SECTION, f"goodput: {r.name}", detail))
            continue
        ours = r.name.startswith("ours")
        figures.append(
            Figure.measured(
                SECTION,
                f"goodput: {r.name}",
                "",
                [r.goodput],
                base,
                baseline_name="the physical limit",
                goal=Goal(">=", 0.9) if ours and base else None,
                note=f"{detail}; {note_s}",
            )
        )
        if ours and best is not None and best.goodput is not None:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"goodput: {r.name} vs the best peer",
                    "",
                    [r.goodput],
                    [best.goodput],
                    baseline_name=best.name,
                    goal=Goal(">", 1.0),
                    note="ahead of every peer when the ratio is above 1",
                )
            )
    figures += _floor_figures(rows, limit)
    if limit.goodput is not None:
        figures.append(
            Figure(SECTION, "goodput: physical limit", "", ours=limit.goodput, note=limit.note)
        )
    else:
        figures.append(skipped(SECTION, "goodput: physical limit", limit.note))
    return figures


def _floor_figures(rows: list[Row], limit: Row) -> list[Figure]:
    """Issue 46: every row against the physical floor measured in this run, as ratios: per
    preemption (the median of its preemption -> training, the hold released for all) against
    Slurm's restart of a trivial job + ``import torch``; the first start (submit -> first
    step) against Slurm's start of a trivial job + ``import torch``. Goal for ours: 1.05x. The
    rows that run torch's own DDP and optimizer (:data:`TORCH_DDP_ROWS`) also per preemption
    against that script's own floor: the trivial job's restart + the same script's start under
    a plain srun (torch's compiler, which those import, is the script's, not a tool's), and
    their first start against the trivial job's first start + that script's start."""
    figures: list[Figure] = []
    per = limit.restart_s[0] if limit.restart_s else None
    for r in rows:
        ours = r.name.startswith("ours")
        split = "; ".join(" / ".join(f"{x:.1f}" for x in parts) for parts in r.split)
        if per is not None and r.restart_s:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"per preemption vs the floor: {r.name}",
                    "s",
                    r.restart_s,
                    [per],
                    baseline_name="Slurm's restart of a trivial job + import torch",
                    goal=Goal("<=", 1.05) if ours else None,
                    note=f"stop / Slurm / start per preemption (s): {split or '-'}",
                )
            )
        own = _own_floor(limit)
        if own is not None and r.restart_s and r.name in TORCH_DDP_ROWS:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"per preemption vs its script's floor: {r.name}",
                    "s",
                    r.restart_s,
                    [own],
                    baseline_name="Slurm's restart of a trivial job + the script's own start "
                    "under a plain srun",
                    goal=Goal("<=", 1.05) if ours else None,
                    note=f"the script's own start (torch's DDP and optimizer import its "
                    f"compiler) under a plain srun: {limit.script_start_s:.2f} s, one start of "
                    "the uninterrupted run",
                )
            )
        if r.exit_to_requeue:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"command exit -> requeued (the slowest stop): {r.name}",
                    "s",
                    [max(r.exit_to_requeue)],
                    goal=Goal("<=", EXIT_TO_REQUEUE_GOAL_S, on="ours"),
                    note="per stop (s): "
                    + ", ".join(f"{x:.3f}" for x in r.exit_to_requeue)
                    + "; the requeue event's time (after Slurm took it) minus when rank 0 saw "
                    "every rank's command gone (its exited_at)",
                )
            )
        own_first = _own_first_floor(limit)
        if own_first is not None and r.first_step_s is not None and r.name in TORCH_DDP_ROWS:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"first start vs its script's floor: {r.name}",
                    "s",
                    [r.first_step_s],
                    [own_first],
                    baseline_name="Slurm's start of a trivial job + the script's own start "
                    "under a plain srun",
                    goal=Goal("<=", 1.05) if ours else None,
                    note="submit -> the first step of the first attempt; submit / Slurm and "
                    "launch / start (s): "
                    + (" / ".join(f"{x:.2f}" for x in r.first_split) if r.first_split else "-"),
                )
            )
        if limit.first_step_s is not None and r.first_step_s is not None:
            figures.append(
                Figure.measured(
                    SECTION,
                    f"first start vs the floor: {r.name}",
                    "s",
                    [r.first_step_s],
                    [limit.first_step_s],
                    baseline_name="Slurm's start of a trivial job + import torch",
                    goal=Goal("<=", 1.05) if ours else None,
                    note="submit -> the first step of the first attempt; submit / Slurm and "
                    "launch / start (s): "
                    + (" / ".join(f"{x:.2f}" for x in r.first_split) if r.first_split else "-"),
                )
            )
    return figures


def _own_floor(limit: Row) -> float | None:
    """Slurm's restart of a trivial job + the torch-DDP script's own start under a plain srun."""
    if limit.trivial_restart_s is None or limit.script_start_s is None:
        return None
    return limit.trivial_restart_s + limit.script_start_s


def _own_first_floor(limit: Row) -> float | None:
    """Slurm's first start of a trivial job + the torch-DDP script's own start under a plain
    srun."""
    if limit.trivial_first_s is None or limit.script_start_s is None:
        return None
    return limit.trivial_first_s + limit.script_start_s


def _hold_figures(holds: list[HoldRow], limit: Row) -> list[Figure]:
    """The hold kept (nothing released): each mode's signal -> training again, against the
    floor per preemption; the successor queued ahead against the requeue (goal: sooner)."""
    figures: list[Figure] = []
    per = limit.restart_s[0] if limit.restart_s else None
    by_mode = {h.mode: h for h in holds if h.signal_to_training_s is not None}
    for h in holds:
        name = f"preemption -> training, {h.name}"
        split = " / ".join(f"{x:.1f}" for x in h.split) if h.split else "-"
        note = (
            f"stop / Slurm / start {split} s; PENDING reasons {sorted(h.reasons) or '-'}; "
            f"jobs submit recorded {h.used or '-'}" + (f"; {h.note}" if h.note else "")
        )
        if h.signal_to_training_s is None:
            figures.append(skipped(SECTION, name, note))
            continue
        figures.append(
            Figure.measured(
                SECTION,
                name,
                "s",
                [h.signal_to_training_s],
                [per] if per else None,
                baseline_name="the floor per preemption (hold released)",
                note=note,
            )
        )
    fast, slow = by_mode.get("fastest"), by_mode.get("requeue")
    if fast is not None and slow is not None:
        figures.append(
            Figure.measured(
                SECTION,
                "hold kept: fastest (successor) vs requeue",
                "s",
                [fast.signal_to_training_s or 0.0],
                [slow.signal_to_training_s or 0.0],
                baseline_name="requeue.mode requeue (Slurm's hold)",
                goal=Goal("<", 1.0),
                note="signal -> training again, one preemption each, nothing released",
            )
        )
    return figures
