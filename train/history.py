"""The requeue history of one run: ``RUN_DIR/events.jsonl`` (torch-free).

One JSON object per line, appended by rank 0 only::

    {"time": 1790000000.0, "event": "preempted", "step": 120, "restart_count": 1,
     "job_id": "42", ...}

Events: start, resume, signal, checkpoint, requeue, preempted, timeout, failure, target (the
first evaluation at ``train.target_accuracy``; ``complete`` follows), complete,
budget_exhausted, cancelled (a plain ``scancel``: checkpointed, not requeued). The budgets of
:class:`train.config.RequeueConfig` are checked against the
preempted/timeout/failure counts, and ``jobs`` shows :meth:`RunHistory.summary` ("preempted 2x,
resumed at step 120").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["EVENTS", "BudgetConfig", "RunHistory", "read_jsonl"]

EVENTS = (
    "start",
    "resume",
    "signal",
    "checkpoint",
    "requeue",
    "preempted",
    "timeout",
    "failure",
    "target",
    "complete",
    "budget_exhausted",
    "cancelled",
)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, oldest first; a missing file has none, and a line
    that does not parse (being written, or torn by a crash) is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


# events that consume a requeue budget, with the RequeueConfig field that limits them
_BUDGETS = {
    "preempted": "max_preemptions",
    "timeout": "max_timeouts",
    "failure": "max_failures",
}


class BudgetConfig(Protocol):
    """The part of :class:`train.config.RequeueConfig` the budget check reads."""

    @property
    def max_preemptions(self) -> int: ...
    @property
    def max_timeouts(self) -> int: ...
    @property
    def max_failures(self) -> int: ...


class RunHistory:
    """Reads and appends ``RUN_DIR/events.jsonl``."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / "events.jsonl"

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event (one ``write`` of one line, fsynced) and return it."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; expected one of {', '.join(EVENTS)}")
        record = {"time": round(time.time(), 3), "event": event, **fields}
        line = json.dumps(record, sort_keys=False, default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND + a single write keeps lines whole even if another writer appends too
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # a crash mid-write leaves a torn last line: start on a fresh line, not glued to it
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def events(self) -> list[dict[str, Any]]:
        """All events, oldest first; a torn or malformed line (a crash mid-write) is skipped."""
        return [r for r in read_jsonl(self.path) if "event" in r]

    def counts(self) -> dict[str, int]:
        """Number of events of each kind (every kind present, 0 when absent)."""
        counts = dict.fromkeys(EVENTS, 0)
        for e in self.events():
            counts[e["event"]] = counts.get(e["event"], 0) + 1
        return counts

    def check_budget(self, requeue_config: BudgetConfig) -> str | None:
        """Why the run must stop instead of being requeued, or None when within budget.

        A budget of N allows N requeues of that kind; the (N+1)-th event exhausts it.
        """
        counts = self.counts()
        for event, attr in _BUDGETS.items():
            limit = int(getattr(requeue_config, attr))
            if counts[event] > limit:
                return (
                    f"{event} {counts[event]}x, over the budget requeue.{attr}={limit}; "
                    f"not requeuing (raise requeue.{attr} to allow more)"
                )
        return None

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable summary: counts, restarts, last resume step, final state."""
        events = self.events()
        counts = self.counts()
        resumes = [e for e in events if e["event"] == "resume"]
        last = events[-1] if events else None
        terminal = ("complete", "budget_exhausted", "cancelled")
        final = next((e for e in reversed(events) if e["event"] in terminal), None)
        return {
            "preemptions": counts["preempted"],
            "timeouts": counts["timeout"],
            "failures": counts["failure"],
            "requeues": counts["requeue"],
            "resumes": len(resumes),
            "resumed_at_step": resumes[-1].get("step") if resumes else None,
            "last_event": last["event"] if last else None,
            "last_step": next((e["step"] for e in reversed(events) if "step" in e), None),
            "complete": final is not None and final["event"] == "complete",
            "budget_exhausted": final["reason"]
            if final is not None and final["event"] == "budget_exhausted"
            else None,
            "cancelled": final is not None and final["event"] == "cancelled",
            "counts": counts,
        }

    def summary(self) -> str:
        """One line for humans, e.g. ``preempted 2x, timeout 1x, resumed at step 120``."""
        d = self.to_dict()
        parts = []
        for key, label in (
            ("preemptions", "preempted"),
            ("timeouts", "timeout"),
            ("failures", "failed"),
        ):
            if d[key]:
                parts.append(f"{label} {d[key]}x")
        if d["resumed_at_step"] is not None:
            parts.append(f"resumed at step {d['resumed_at_step']}")
        if d["complete"]:
            parts.append(f"complete at step {d['last_step']}")
        elif d["budget_exhausted"]:
            parts.append(f"stopped: {d['budget_exhausted']}")
        elif d["cancelled"]:
            parts.append(f"cancelled at step {d['last_step']}")
        if not parts:
            return "no events yet" if d["last_event"] is None else "no interruptions"
        return ", ".join(parts)
