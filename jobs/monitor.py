"""Job states, following, logs and cancelling for recorded runs (Slurm or local).

States come from ONE ``sacct`` call per query (``SlurmClient.job_states``: an array's base id
returns all its tasks), or from ``local_state.json`` for local runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from cluster.local.daemons import pid_alive
from cluster.models import JobInfo
from jobs.records import RunRecord

if TYPE_CHECKING:
    from cluster.client import SlurmClient

ClientFactory = Callable[[], "SlurmClient"]
FINAL_LOCAL = {"COMPLETED", "FAILED", "CANCELLED"}
UNKNOWN_GIVE_UP_S = 60.0


def local_states(record: RunRecord) -> dict[str, JobInfo]:
    """States of a local run from its supervisor's state file."""
    from jobs.localrun import read_state

    state = read_state(record.run_dir)
    alive = pid_alive(record.pid)
    out: dict[str, JobInfo] = {}
    tasks = state.get("tasks", {})
    for job_id in record.job_ids():
        entry = tasks.get(job_id, {})
        name = entry.get("state", "PENDING" if alive else "FAILED")
        reason = ""
        if name not in FINAL_LOCAL and not alive:
            name, reason = "FAILED", "local supervisor is gone"
        codes = [c for c in entry.get("exit_codes", []) if c is not None]
        code = next((c for c in codes if c != 0), 0) if codes else None
        out[job_id] = JobInfo(job_id, name, exit_code=code, reason=reason, source="local")
    return out


def states_many(runs: list[RunRecord], client: ClientFactory) -> dict[str, JobInfo]:
    """States of every task of several runs: one sacct call for all Slurm runs together."""
    out: dict[str, JobInfo] = {}
    slurm_runs = [r for r in runs if r.executor == "slurm" and r.job_id]
    if slurm_runs:
        found = client().job_states([r.job_id for r in slurm_runs])
        for r in slurm_runs:
            for jid in r.job_ids():
                out[jid] = found.get(jid) or JobInfo(jid, "UNKNOWN", reason="not known to Slurm")
    for r in runs:
        if r.executor == "local":
            out.update(local_states(r))
    return out


def task_states(record: RunRecord, client: ClientFactory) -> dict[str, JobInfo]:
    return states_many([record], client)


def reason(info: JobInfo) -> str:
    """Why a job waits (sacct keeps a pending reason after the job ran: drop it then)."""
    if info.terminal and info.source != "local":
        return ""
    return "" if info.reason in ("", "None") else info.reason


def outcome(states: dict[str, JobInfo]) -> int:
    """0 iff every task COMPLETED."""
    return 0 if states and all(s.state == "COMPLETED" for s in states.values()) else 1


def _finished(info: JobInfo) -> bool:
    return info.terminal or (info.source == "local" and info.state in FINAL_LOCAL)


class LogTail:
    """New complete lines of a growing file (survives the file appearing late)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        return [ln.decode("utf-8", "replace") for ln in lines]

    def flush(self) -> list[str]:
        rest = self.read()
        if self.partial:
            rest.append(self.partial.decode("utf-8", "replace"))
            self.partial = b""
        return rest


def follow(
    record: RunRecord,
    client: ClientFactory,
    *,
    rank: int = 0,
    out: IO[str] | None = None,
    poll_s: float = 2.0,
    only: str | None = None,
    show_states: bool = True,
) -> int:
    """Stream state changes, new events and new rank-``rank`` log lines until the job ends.

    Returns 0 iff every followed task COMPLETED.
    """
    stream = out or sys.stdout
    ids = [only] if only else record.job_ids()
    many = len(ids) > 1
    tails = {jid: LogTail(record.log_file(jid, rank)) for jid in ids}
    event_tails = {t.run_dir: LogTail(Path(t.run_dir) / "events.jsonl") for t in record.tasks}
    last: dict[str, str] = {}
    settled = unknown = 0
    while True:
        states = {k: v for k, v in task_states(record, client).items() if k in tails}
        # Accounting may lag a fresh submission for a moment; a job unknown for long is gone.
        unknown = unknown + 1 if all(s.state == "UNKNOWN" for s in states.values()) else 0
        if unknown * poll_s > UNKNOWN_GIVE_UP_S:
            stream.write(f"jobs: Slurm does not know {', '.join(states)} (purged?); giving up\n")
            stream.flush()
            return 1
        for jid, info in states.items():
            if show_states and last.get(jid) != info.state:
                why = f" ({reason(info)})" if reason(info) else ""
                stream.write(f"[{time.strftime('%H:%M:%S')}] {jid}: {info.state}{why}\n")
                last[jid] = info.state
        for jid, tail in tails.items():
            now = states.get(jid)
            if now is not None and now.state in ("PENDING", "UNKNOWN") and not tail.offset:
                continue  # no log yet; skip the stat for big arrays
            prefix = f"[{jid}] " if many else ""
            for line in tail.read():
                stream.write(f"{prefix}{line}\n")
        if show_states:
            for tail in event_tails.values():
                for line in tail.read():
                    stream.write(f"event: {line.strip()}\n")
        stream.flush()
        done = bool(states) and all(_finished(i) for i in states.values())
        # Confirm once: a job being requeued can show a final state for a moment.
        settled = settled + 1 if done else 0
        if settled >= 2:
            for jid, tail in tails.items():
                prefix = f"[{jid}] " if many else ""
                for line in tail.flush():
                    stream.write(f"{prefix}{line}\n")
            stream.flush()
            return outcome(states)
        time.sleep(poll_s if not done else min(poll_s, 1.0))


def print_logs(record: RunRecord, rank: int, only: str | None, out: IO[str]) -> int:
    """Print the rank-``rank`` log of one task or of every task (with headers)."""
    ids = [only] if only else record.job_ids()
    found = 0
    for jid in ids:
        path = record.log_file(jid, rank)
        if not path.exists():
            continue
        found += 1
        if len(ids) > 1:
            out.write(f"==> {jid} rank {rank}: {path} <==\n")
        with path.open("r", encoding="utf-8", errors="replace") as f:
            for chunk in iter(lambda: f.read(65536), ""):
                out.write(chunk)
    out.flush()
    return found


def cancel(record: RunRecord, client: ClientFactory, only: str | None = None) -> list[str]:
    """Cancel the run (or one task of it); returns what was cancelled."""
    if record.executor == "local":
        if pid_alive(record.pid):
            assert record.pid is not None
            os.kill(record.pid, signal.SIGTERM)
            return [record.job_id]
        return []
    target = [only] if only else [record.job_id]
    # Not requeueable first: neither Slurm nor train's guard may bring a cancelled job back.
    client().cancel(target, no_requeue=True)
    return target


def events_summary(record: RunRecord) -> dict[str, str]:
    """Per task run dir: the requeue history in a few words."""
    # train.history is torch-free: jobs and train read the same file the same way.
    from train.history import RunHistory

    out = {}
    for task in record.tasks:
        history = RunHistory(task.run_dir)
        out[task.run_dir] = history.summary() if history.events() else ""
    return out


def progress_summary(record: RunRecord) -> dict[str, dict[str, object]]:
    """Per task run dir: newest step, loss and test accuracy (from train's metrics.jsonl)."""
    from jobs.records import latest_progress

    return {t.run_dir: latest_progress(t.run_dir) for t in record.tasks}
