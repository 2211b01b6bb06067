"""What the end of a pipeline's stage does to the stages waiting on it (jobs.pipeline): a
completed stage lets them start (a chain's: their dependency pointed at the link that completed
it), a stage over without completing cancels those waiting for ``ok`` and records why. Called
by the stage's batch script at its exit (``python -m jobs.pipeline stage-end``) and by a chain's
link-end (:mod:`jobs.chain`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobs import records
from train.history import RunHistory

if TYPE_CHECKING:
    from cluster import Slurm


def unfinished(events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a run is over without completing (None: it completed, or goes on): a spent budget,
    a cancel, or a failure nothing restarted (pure)."""
    if any(e.get("event") == "complete" for e in events):
        return None
    starts = [i for i, e in enumerate(events) if e.get("event") in ("start", "resume")]
    tail = events[starts[-1] :] if starts else events
    spent = next((e for e in tail if e.get("event") in ("budget_exhausted", "chain_ended")), None)
    if spent is not None:
        return str(spent.get("reason") or "a budget is spent")
    kinds = [e.get("event") for e in tail]
    if "cancelled" in kinds:
        return "cancelled"
    return None


def release_dependents(
    record: records.RunRecord,
    job_id: str,
    completed: bool,
    why: str | None,
    client: Slurm | None = None,
) -> None:
    """When a stage is over: the stages waiting on it start (a chain's: their dependency
    pointed at the link that ended it) or, waiting for ``ok`` on a stage that did not
    complete, are cancelled with the reason recorded in their run directories."""
    if not record.dependents:
        return
    from cluster import ClusterError

    if client is None:
        from cluster import slurm_client

        client = slurm_client(timeout=60, shielded=True)
    try:
        if completed or record.dependents_after == "any":
            if record.chain_job_ids:  # the chain's last link is not the one that ended it
                kind = "afterok" if record.dependents_after == "ok" else "afterany"
                for dep in record.dependents:
                    client.set_dependency(dep, f"{kind}:{job_id}")
            return
        if why is None:
            return
        for dep in record.dependents:
            for run in records.iter_records():
                if run.job_id == dep:
                    RunHistory(run.run_dir).append(
                        "cancelled", reason=f"stage {record.stage} ended without completing: {why}"
                    )
                    break
        client.cancel(record.dependents, no_requeue=True)
    except (ClusterError, OSError) as exc:
        print(f"jobs.pipeline: the stages after {record.stage}: {exc}", file=sys.stderr)
