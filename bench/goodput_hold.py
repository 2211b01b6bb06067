"""The requeue hold as users meet it (issue 46), a part of ``python -m bench --only goodput``.

The goodput rows release every requeue hold at once, the same way for every row (their figures
are the floor). A user's job is not released: after a real preemption Slurm holds the requeued
job in BeginTime (``cred_expire``, 120 s by default, then a scheduling pass). Here the same plain
script (``goodput_work bare``: torch's own DDP and optimizer, no recipe of ours) runs under
``jobs submit`` twice, each preempted once by a job in ``urgent`` on one of its nodes, and
nothing is released by hand:

- ``requeue.mode: requeue``: the same job, requeued, held by Slurm;
- ``requeue.mode: fastest``: on a cluster with Slurm's default hold, a chain of jobs whose
  successor is queued ahead (``afternotok``) and starts when the preempted link ends.

Per row: signal (the urgent job's submission) -> training again (the first step written after
the job left RUNNING), split into the stop (-> the job leaves RUNNING), Slurm (-> the run's next
job RUNNING: the hold, or the successor's start) and the start (-> its first step), as the
bench's ``squeue`` sees them every 0.25 s; the PENDING reasons seen in between; the mode and the
reason ``jobs submit`` recorded (run.json).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import Skip, wait_until
from train.history import read_jsonl

if TYPE_CHECKING:
    from bench.bench_goodput import Bench

#: the row name -> the spec's requeue.mode
MODES: dict[str, str] = {
    "hold kept: requeue (the same job)": "requeue",
    "hold kept: fastest (successor queued ahead)": "fastest",
}


@dataclass
class HoldRow:
    name: str
    mode: str
    signal_to_training_s: float | None = None
    #: stop (-> leaves RUNNING) / Slurm (-> the next job RUNNING) / start (-> its first step)
    split: tuple[float, float, float] | None = None
    reasons: set[str] = field(default_factory=set)
    used: str = ""
    note: str = ""


def _job_ids(run_dir: Path, first: str) -> list[str]:
    try:
        data = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [first]
    links = data.get("chain_job_ids") or []
    return [str(j) for j in links] or [first]


def run_hold_row(b: Bench, run: Path, name: str, spec_text: str) -> HoldRow:
    """Submit ``spec_text`` (a plain script under ``jobs submit``), preempt it once
    ``b.sched.after_s`` s after it is seen RUNNING, release nothing, and time it back."""
    from bench.bench_goodput import _first_node, submit_spec

    row = HoldRow(name, MODES[name])
    job, run_dir = submit_spec(b, run, spec_text)
    progress = run / "task" / "progress.jsonl"
    try:
        record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        row.used = f"{record.get('restart_mode')}: {record.get('restart_reason')}"
        wait_until(f"job {job} RUNNING", lambda: b.state(job)[0] == "RUNNING", 300, poll=0.25)
        time.sleep(b.sched.after_s)
        state, nodes = b.state(job)
        if state != "RUNNING":
            raise Skip(f"job {job} left RUNNING before the preemption ({state})")
        signal_at = time.time()
        b.urgent(_first_node(nodes), run)
        wait_until(f"job {job} to leave RUNNING", lambda: b.state(job)[0] != "RUNNING", 120,
                   poll=0.25)  # fmt: skip
        left = time.time()

        def back() -> bool:
            ids = _job_ids(run_dir, job)
            infos = b.client.poll_states(ids)
            for jid in ids:
                info = infos.get(jid)
                if info is None:
                    continue
                if info.state == "PENDING" and info.reason:
                    row.reasons.add(info.reason)
                if info.state == "RUNNING":  # the same job again (requeued) or a successor
                    return True
            return False

        wait_until("the run's next job RUNNING", back, 400, poll=0.25)  # the hold: 120-148 s
        again = time.time()

        def first_step() -> float | None:
            later = [
                float(r["time"])
                for r in read_jsonl(progress)
                if isinstance(r.get("step"), int) and float(r.get("time", 0)) > left
            ]
            return min(later) if later else None

        step_at = wait_until("the first step after the restart", first_step, 300, poll=0.25)
        row.signal_to_training_s = step_at - signal_at
        row.split = (left - signal_at, again - left, step_at - again)
    finally:
        ids = _job_ids(run_dir, job)
        b.client.cancel(list(reversed(ids)), no_requeue=True)
    return row


def hold_table(rows: list[HoldRow]) -> str:
    out = [
        "| row (plain script, no recipe; hold kept) | signal -> training again (s) "
        "| stop / Slurm / start (s) | PENDING reasons seen | jobs submit recorded |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        t = f"{r.signal_to_training_s:.1f}" if r.signal_to_training_s is not None else "-"
        sp = " / ".join(f"{x:.1f}" for x in r.split) if r.split else "-"
        why = r.used or r.note or "-"
        out.append(f"| {r.name} | {t} | {sp} | {', '.join(sorted(r.reasons)) or '-'} | {why} |")
    return "\n".join(out)
