"""What ``python -m jobs status`` shows: job states plus train's progress and requeue history.

States come in from one Slurm query (:func:`jobs.monitor.states_many`); progress and history
are read from each task's run directory (``metrics.jsonl`` tail, ``events.jsonl``).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import IO, Any

from cluster import JobInfo
from jobs.goodputview import run_records
from jobs.monitor import (
    describe_failure,
    events_summary,
    last_failures,
    progress_summary,
    reason,
)
from jobs.records import RunRecord, describe_progress

# Past this many tasks, status reads no per-task files (a 1000-task sweep stays fast).
DETAIL_LIMIT = 50
SHOWN_LIMIT = 20


def _elapsed(seconds: int | None) -> str:
    from cluster import format_slurm_time

    return format_slurm_time(seconds) if seconds else ""


def restart_mode_line(mode: str, reason: str) -> str:
    """``  restarts: a successor queued ahead (chain of jobs): WHY``: how a stopped run comes
    back, as ``jobs submit`` chose it (run.json's ``restart_mode``; issue 46)."""
    how = "a successor queued ahead (chain of jobs)" if mode == "chain" else (
        "requeued (the same job; Slurm holds it in BeginTime before it starts again)"
    )  # fmt: skip
    return f"  restarts: {how}" + (f": {reason}" if reason else "")


def held(info: JobInfo, now: float | None = None) -> str:
    """``held by Slurm until 20:34:29 (BeginTime: requeue hold), about 130 s``: a pending job
    Slurm holds until a begin time (issue 46: after a requeue, ``cred_expire``: 120-148 s on
    idle nodes), from the same one squeue (its ``StartTime``); "" for any other job."""
    if info.state != "PENDING" or info.reason != "BeginTime" or info.start_at is None:
        return ""
    what = "requeue hold" if (info.restarts or 0) > 0 else "its begin time"
    left = max(0, round(info.start_at - (time.time() if now is None else now)))
    until = time.strftime("%H:%M:%S", time.localtime(info.start_at))
    return f"held by Slurm until {until} (BeginTime: {what}), about {left} s"


def _slurm_restarts(info: JobInfo, run_dir: str) -> str:
    """``restarted Nx (Slurm)`` when Slurm restarted the job but the run wrote no event of it
    (a command entrypoint that does not record its restarts); from the same one squeue."""
    count = info.restarts
    if not isinstance(count, int) or count <= 0:
        return ""
    from train.history import RunHistory

    recorded = RunHistory(run_dir).to_dict().get("restarts") or 0
    return "" if recorded else f"restarted {count}x (Slurm)"


def attempt_seconds(events: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds each attempt of a run ran, by its restart count, from its own events (pure):
    from its process start (the ``start``/``resume`` event's time less its ``startup``
    seconds) to its last event. Events are typed (:data:`train.schema.EVENT`)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for e in events:
        t = e.get("time")
        if t is None:
            continue
        n = e.get("restart_count") or 0
        began = t
        startup = e.get("startup")
        if e["event"] in ("start", "resume") and isinstance(startup, dict):
            spent = sum(v for v in startup.values() if isinstance(v, int | float) and v > 0)
            began = t - min(spent, t)
        first[n] = min(first.get(n, began), began)
        last[n] = max(last.get(n, t), t)
    return {n: last[n] - first[n] for n in first}


def run_elapsed(
    info: JobInfo,
    events: list[dict[str, Any]],
    since: float = 0.0,
    job_ids: Collection[str] = (),
) -> tuple[int | None, int]:
    """(seconds the whole run ran over all its attempts, how many attempts): Slurm's elapsed
    time of the attempt it knows (the newest) plus what the run's events say of the earlier
    ones; where Slurm says nothing (a local run), the events alone. Events before ``since``
    (the submission) are an earlier run's that used the same directory, unless they carry one
    of this run's ``job_ids`` (a node whose clock is behind: kept, as the ledger keeps them)."""
    spans = attempt_seconds(run_records(events, since, job_ids))
    current = info.restarts if isinstance(info.restarts, int) else max(spans, default=0)
    earlier = sum(v for n, v in spans.items() if n < current)
    attempts = len({n for n in spans if n < current}) + 1
    if info.elapsed_s is not None:
        return round(info.elapsed_s + earlier), attempts
    if not spans:
        return None, 0
    return round(sum(spans.values())), len(spans)


def _run_elapsed(r: RunRecord, info: JobInfo, run_dir: str) -> tuple[int | None, int]:
    from train.history import RunHistory

    ours = [*r.slurm_job_ids(), *r.job_ids()]
    return run_elapsed(info, RunHistory(run_dir).events(), r.submitted_at, ours)


def _elapsed_text(total: int | None, attempts: int) -> str:
    if not total:
        return ""
    over = f" over {attempts} attempts" if attempts > 1 else ""
    return f"elapsed {_elapsed(total)}{over}"


def _failed(info: JobInfo) -> bool:
    """Over without completing (a local run's FAILED included)."""
    return info.state != "COMPLETED" and (info.terminal or info.state == "FAILED")


def status_json(runs: list[RunRecord], states: dict[str, JobInfo]) -> list[dict[str, Any]]:
    """Machine-readable status of ``runs`` (every task, its state, progress and history)."""
    data = []
    for r in runs:
        history = events_summary(r)
        detail = len(r.tasks) <= DETAIL_LIMIT
        progress = progress_summary(r) if detail else {}
        failures = last_failures(r) if detail else {}
        tasks = []
        for jid, t in zip(r.job_ids(), r.tasks, strict=False):
            info = states.get(jid)
            if info is None:
                continue
            total, attempts = _run_elapsed(r, info, t.run_dir) if detail else (info.elapsed_s, 1)
            tasks.append(
                {
                    "job_id": jid,
                    "state": info.state,
                    "exit_code": info.exit_code,
                    "reason": reason(info),
                    "held_until": info.start_at if held(info) else None,
                    "nodelist": info.nodelist,
                    "elapsed_s": info.elapsed_s,  # the attempt Slurm knows (the newest)
                    "run_elapsed_s": total,  # the whole run: every attempt
                    "attempts": attempts,
                    "values": t.values,
                    "history": history.get(t.run_dir, ""),
                    "progress": progress.get(t.run_dir, {}),
                    "last_failure": failures.get(t.run_dir),
                    "run_dir": t.run_dir,
                }
            )
        data.append(
            {
                "run_id": r.run_id,
                "name": r.name,
                "job_id": r.job_id,
                "executor": r.executor,
                "run_dir": r.run_dir,
                "submitted_at": r.submitted_at,
                "tasks": tasks,
            }
        )
    return data


def write_status(runs: list[RunRecord], states: dict[str, JobInfo], out: IO[str]) -> None:
    """Human-readable status: one header per run, one line per (interesting) task."""
    for r in runs:
        ids = r.job_ids()
        submitted = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.submitted_at))
        out.write(f"{r.run_id}  job {r.job_id}  {r.executor}  submitted {submitted}\n")
        out.write(f"  run dir {r.run_dir}\n")
        if len(ids) > 1:
            counts: dict[str, int] = {}
            for jid in ids:
                counts[states[jid].state] = counts.get(states[jid].state, 0) + 1
            out.write("  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "\n")
        detail = len(ids) <= DETAIL_LIMIT
        history = events_summary(r) if detail else {}
        progress = progress_summary(r) if detail else {}
        failures = last_failures(r) if detail else {}
        shown = 0
        for jid, t in zip(ids, r.tasks, strict=False):
            info = states[jid]
            if len(ids) > SHOWN_LIMIT and info.state == "COMPLETED":
                continue  # a big sweep: show what still needs attention
            if shown >= SHOWN_LIMIT:
                out.write(f"  ... more tasks (--json shows all {len(ids)})\n")
                break
            shown += 1
            nodes = info.nodelist if info.nodelist not in ("", "None") else ""
            extra = [
                f"exit {info.exit_code}" if info.exit_code else "",
                f"nodes {nodes}" if nodes else "",
                _elapsed_text(
                    *(_run_elapsed(r, info, t.run_dir) if detail else (info.elapsed_s, 1))
                ),
                held(info) or reason(info),
                " ".join(f"{k}={v}" for k, v in t.values.items()),
                describe_progress(progress.get(t.run_dir, {})),
                history.get(t.run_dir, ""),
                _slurm_restarts(info, t.run_dir),
            ]
            line = f"  {jid:<14} {info.state:<11} {'  '.join(e for e in extra if e)}"
            out.write(line.rstrip() + "\n")
            if _failed(info) and t.run_dir in failures:
                # The history line names the error already ("last failure: ..."): not twice.
                said = history.get(t.run_dir, "")
                for text in describe_failure(failures[t.run_dir]):
                    if not (text.startswith("error: ") and text[7:] in said):
                        out.write(f"      {text}\n")
