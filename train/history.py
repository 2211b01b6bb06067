"""The requeue history of one run: ``RUN_DIR/events.jsonl`` (torch-free).

One JSON object per line, appended by rank 0 only::

    {"time": 1790000000.0, "event": "preempted", "step": 120, "restart_count": 1,
     "job_id": "42", ...}

Events: start, resume, signal, checkpoint, requeue, preempted, timeout, failure, target (the
first evaluation at ``train.target_accuracy``; ``complete`` follows), complete,
budget_exhausted, cancelled (a plain ``scancel``: checkpointed, not requeued). The budgets of
:class:`train.spec.config.RequeueConfig` are checked against the
preempted/timeout/failure counts, and ``jobs`` shows :meth:`RunHistory.summary` ("preempted 2x,
resumed at step 120").
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train import runfiles
from train.runfiles import (
    BUDGET_LABELS,
    EVENT_KINDS,
    EVENTS_FILE,
    FAILURE_CLASSES,
    FAILURE_KINDS,
    append_line,
)
from train.schema import EVENT, read_jsonl_checked, read_records

if TYPE_CHECKING:
    from train.spec import RequeueConfig

__all__ = [
    "BUDGETS",
    "BUDGET_SCOPES",
    "EVENTS",
    "FINAL_EVENTS",
    "STOP_EVENTS",
    "RunHistory",
    "attempt_completed_at",
    "budget_counts",
    "over_budget",
    "read_jsonl",
]

# every list of event names derives from the one table of event kinds (train.runfiles)
EVENTS = runfiles.EVENTS
# what consumes a requeue budget (an event, or a failure of one class: train.stop.causes), with
# the RequeueConfig field that limits it
BUDGETS = runfiles.BUDGETS
# the events that interrupt an attempt (what `jobs plot` marks, what explains an attempt's end)
STOP_EVENTS = tuple(k.name for k in EVENT_KINDS if k.interrupts)
# the events that end a run for good
FINAL_EVENTS = tuple(k.name for k in EVENT_KINDS if k.final)


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _shape_change(event: Mapping[str, Any]) -> str | None:
    """``on 1 node (was 2)`` (or ``on 2 ranks (was 4)`` when the node count stayed or is not
    known) for a resume on another world size (train.session writes the fields); else None."""
    now, was = _whole(event.get("world_size")), _whole(event.get("was_world_size"))
    if now is None or was is None or now == was:
        return None
    nodes, was_nodes = _whole(event.get("num_nodes")), _whole(event.get("was_num_nodes"))
    if nodes is not None and was_nodes is not None and nodes != was_nodes:
        return f"on {nodes} node{'s' * (nodes != 1)} (was {was_nodes})"
    return f"on {now} rank{'s' * (now != 1)} (was {was})"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, oldest first; a missing file has none, and a line
    that does not parse (being written, torn by a crash, a foreign or non-UTF-8 byte) is skipped
    (:func:`read_jsonl_checked` also says which). Records of a known kind are read through
    their schema instead (:func:`train.schema.read_records`)."""
    return read_jsonl_checked(path)[0]


def failure_class(event: Mapping[str, Any]) -> str:
    """The class of a ``failure`` event (train.stop.causes); older events have none: unknown."""
    cls = event.get("failure_class")
    return cls if cls in FAILURE_CLASSES else "unknown"


# the counts the summary line names, with its word for each (the table's order)
_SUMMARY = tuple((k.count_key, k.summary) for k in EVENT_KINDS if k.count_key and k.summary)
_NAMED = {f.name: f.named for f in FAILURE_KINDS}


def over_budget(counts: Mapping[str, int], requeue_config: RequeueConfig) -> str | None:
    """Why a run with these event ``counts`` must stop instead of being requeued, or None when
    within budget (pure). A budget of N allows N requeues of that kind; the (N+1)-th event
    exhausts it."""
    limits = requeue_config.budgets()
    for event, attr in BUDGETS.items():
        limit = limits[attr]
        count = int(counts.get(event, 0))
        if count > limit:
            label = BUDGET_LABELS.get(event, event)
            return (
                f"{label} {count}x, over the budget requeue.{attr}={limit}; "
                f"not requeuing (raise requeue.{attr} to allow more)"
            )
    return None


#: The scope of each budget (the spec's field descriptions say the same, train/spec/policy.py):
#: what the count a budget is checked against covers (:func:`budget_counts`). A submission is a
#: ``jobs submit`` (one Slurm job id, kept across requeues; a local run: its restarts); a new
#: submission that resumes a run directory starts with fresh budgets.
BUDGET_SCOPES = {
    "max_preemptions": "submission",
    "max_timeouts": "submission",
    "max_failures": "submission",
    "max_infra_failures": "submission",
    "max_user_failures": "submission",
    "max_hangs": "submission",
    "max_restarts_without_progress": "submission",
    "max_restarts_in_place": "allocation",
}


def _same_job(a: object, b: object) -> bool:
    return (None if a is None else str(a)) == (None if b is None else str(b))


def _whole_or_zero(value: object) -> int | None:
    """A count field as written (0 included); None for a damaged or foreign value."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def attempt_completed_at(
    events: Iterable[Mapping[str, Any]],
    *,
    job_id: object,
    restart_count: int,
    in_place: int = 0,
) -> float | None:
    """When rank 0 recorded this attempt (job, restart count, restart in place) ``complete``;
    None: not (yet). THE definition of a completed run, shared by the batch script
    (:mod:`train.stop.step`), the command supervisor and the local executor: once rank 0
    recorded ``complete``, a later non-zero exit of any rank (gloo's abort at exit, an OOM kill
    in teardown, a rank stopped while it lingers) is not a failure and the run ends COMPLETED."""
    for e in events:
        restart, place = e.get("restart_count"), e.get("in_place", 0)
        if (
            e.get("event") == "complete"
            and _same_job(e.get("job_id"), job_id)
            and _whole_or_zero(restart) == restart_count
            and _whole_or_zero(place) == in_place
        ):
            at = e.get("time")
            return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
    return None


def _submission(
    events: list[dict[str, Any]], job_id: object, submission: str | None = None
) -> list[dict[str, Any]]:
    """The events of the current submission (``job_id``'s; the local executor's runs have no
    job id: ``submission``'s, the ``local-N`` their events carry): the newest ones back to
    another job id or submission, or back to where the restart count fell (a new submission
    starts at 0 again: events written before submissions were recorded)."""
    start = len(events)
    later = None
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if not _same_job(e.get("job_id"), job_id):
            break
        if submission is not None and e.get("submission") != submission:
            break
        count = _count(e.get("restart_count"))
        if later is not None and count > later:
            break
        later, start = count, i
    return events[start:]


def budget_counts(
    events: Iterable[Mapping[str, Any]],
    *,
    job_id: object,
    restart_count: int,
    submission: str | None = None,
) -> dict[str, int]:
    """The counts the stop decision checks the budgets against, each over its scope
    (:data:`BUDGET_SCOPES`): the stops of the current submission (``preempted``, ``timeout``,
    ``failure``, ``failure_CLASS``, ``hang``), the restarts in place of this allocation
    (``restart_in_place``: job id and restart count), and ``stalled_restarts``: how many
    consecutive restarts of this submission resumed from the same checkpoint step
    (``stalled_step``, -1 when no restart resumed from a known step)."""
    listed = [dict(e) for e in events]
    mine = _submission(listed, job_id, submission)
    counts = dict.fromkeys((*EVENTS, *(f"failure_{c}" for c in FAILURE_CLASSES)), 0)
    for e in mine:
        name = str(e.get("event"))
        counts[name] = counts.get(name, 0) + 1
        if name == "failure":
            counts[f"failure_{failure_class(e)}"] += 1
    counts["restart_in_place"] = sum(
        1
        for e in mine
        if e.get("event") == "restart_in_place" and _count(e.get("restart_count")) == restart_count
    )
    steps = [_resumed_from(e) for e in mine if _restarted(e)]
    stalled, at = 0, -1
    if steps and isinstance(steps[-1], int) and not isinstance(steps[-1], bool):
        at = steps[-1]
        for step in reversed(steps):
            if step != at:
                break
            stalled += 1
    counts["stalled_restarts"], counts["stalled_step"] = stalled, at
    return counts


def _restarted(e: Mapping[str, Any]) -> bool:
    """A restart's start: a ``resume``, or a command's ``start`` that carries the step it had
    reported (``reported_step``: it keeps no checkpoint of ours)."""
    return e.get("event") == "resume" or (e.get("event") == "start" and "reported_step" in e)


def _resumed_from(e: Mapping[str, Any]) -> object:
    """Where a restart resumed: its checkpoint's step, else the step its command had reported
    with ``train.report`` (train.stop.facts.progress_step: the same measure at the stop)."""
    step = e.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else e.get("reported_step")


def _count(value: Any) -> int:
    """A non-negative int from an event field (a damaged or foreign value counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class RunHistory:
    """Reads and appends ``RUN_DIR/events.jsonl``."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / EVENTS_FILE

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event (one ``write`` of one line, fsynced) and return it."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; expected one of {', '.join(EVENTS)}")
        record = {"time": round(time.time(), 3), "event": event, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one O_APPEND write, fsynced, never through a link, never glued onto a torn line
        append_line(self.path, json.dumps(record, sort_keys=False, default=str))
        return record

    def events(self) -> list[dict[str, Any]]:
        """All events, oldest first; a torn or malformed line (a crash mid-write) is skipped."""
        return read_records(self.path, EVENT)  # typed (train.schema): the rest is skipped

    def counts(self) -> dict[str, int]:
        """Number of events of each kind (every kind present, 0 when absent)."""
        counts = dict.fromkeys((*EVENTS, *(f"failure_{c}" for c in FAILURE_CLASSES)), 0)
        for e in self.events():
            counts[e["event"]] = counts.get(e["event"], 0) + 1
            if e["event"] == "failure":
                key = f"failure_{failure_class(e)}"
                counts[key] += 1
        return counts

    def budget_counts(
        self, job_id: object, restart_count: int, submission: str | None = None
    ) -> dict[str, int]:
        """:func:`budget_counts` of the recorded events (what the stop decision reads)."""
        return budget_counts(
            self.events(), job_id=job_id, restart_count=restart_count, submission=submission
        )

    def check_budget(self, requeue_config: RequeueConfig) -> str | None:
        """Why the run must stop instead of being requeued, or None when within budget
        (:func:`over_budget` of the recorded counts)."""
        return over_budget(self.counts(), requeue_config)

    def to_dict(self) -> dict[str, Any]:
        """Machine-readable summary: counts, restarts, last resume step, final state."""
        events = self.events()
        counts = self.counts()
        resumes = [e for e in events if e["event"] == "resume"]
        last = events[-1] if events else None
        final = next((e for e in reversed(events) if e["event"] in FINAL_EVENTS), None)
        return {
            "preemptions": counts["preempted"],
            "timeouts": counts["timeout"],
            "failures": counts["failure"],
            "hangs": counts["hang"],
            "node_failures": counts["node_fail"],
            # the nodes Slurm failed under the run (every node_fail event's, late ones too)
            "failed_nodes": sorted(
                {
                    str(n)
                    for e in events
                    if e["event"] == "node_fail" and isinstance(e.get("nodes"), list)
                    for n in e["nodes"]
                }
            ),
            "restarts_in_place": counts["restart_in_place"],
            "requeues": counts["requeue"],
            "resumes": len(resumes),
            "resumed_at_step": resumes[-1].get("step") if resumes else None,
            # "on 1 node (was 2)": the newest resume ran on another shape than its checkpoint's
            "resumed_shape": _shape_change(resumes[-1]) if resumes else None,
            "last_event": last["event"] if last else None,
            "last_step": next(
                (e["step"] for e in reversed(events) if e.get("step") is not None), None
            ),
            "complete": final is not None and final["event"] == "complete",
            "budget_exhausted": final.get("reason") or "budget spent"
            if final is not None and final["event"] == "budget_exhausted"
            else None,
            "cancelled": final is not None and final["event"] == "cancelled",
            # the newest failure event as written (error, and for a command exit_code or
            # signal and stderr_tail), or None
            "last_failure": next((e for e in reversed(events) if e["event"] == "failure"), None),
            # nodes the run was kept off, and why ("n2 excluded after hang at step 57")
            "quarantined": [
                f"{','.join(map(str, e['nodes']))} excluded after {e.get('reason', 'a fault')}"
                for e in events
                if e["event"] == "quarantine" and isinstance(e.get("nodes"), list) and e["nodes"]
            ],
            # restarts the events saw (Slurm's SLURM_RESTART_COUNT of the newest event)
            "restarts": max((_count(e.get("restart_count")) for e in events), default=0),
            "counts": counts,
        }

    def summary(self) -> str:
        """One line for humans, e.g. ``preempted 2x, timeout 1x, resumed at step 120``."""
        d = self.to_dict()
        parts = []
        for key, label in _SUMMARY:
            if d[key]:
                parts.append(f"{label} {d[key]}x")
                if key == "node_failures" and d["failed_nodes"]:
                    parts[-1] += f" ({','.join(d['failed_nodes'])})"
        parts.extend(d["quarantined"])
        if d["resumed_at_step"] is not None:
            shape = f" {d['resumed_shape']}" if d["resumed_shape"] else ""
            parts.append(f"resumed at step {d['resumed_at_step']}{shape}")
        # a command entrypoint's events have no step (step None): "complete", not "at step None"
        at = f" at step {d['last_step']}" if d["last_step"] is not None else ""
        if d["complete"]:
            parts.append(f"complete{at}")
        elif d["budget_exhausted"]:
            parts.append(f"stopped: {d['budget_exhausted']}")
        elif d["cancelled"]:
            parts.append(f"cancelled{at}")
        failure = d["last_failure"]
        if failure and not d["complete"] and failure.get("error"):
            # the real cause (a command's exit code and last stderr line), not the step's code
            word = _NAMED[failure_class(failure)] or ""
            # the rule that sorted it (train.stop.causes: "... (rule NAME: the line)")
            rule = re.search(r"\(rule ([^:()]+):", str(failure.get("cause") or ""))
            if rule:
                word = f"{word}, " * bool(word) + f"rule {rule.group(1)}"
            named = f" ({word})" if word else ""
            parts.append(f"last failure{named}: {str(failure['error'])[:160]}")
        if not parts:
            return "no events yet" if d["last_event"] is None else "no interruptions"
        return ", ".join(parts)
