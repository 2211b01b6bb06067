"""The root of a failure of several ranks of a command (torch-free).

When a rank's command ends non-zero, its supervisor writes, at once (before it waits for a
stop signal that may explain the exit), one small report of it on the shared run directory:
``RUN_DIR/.failures/JOB-ATTEMPT.ranks/MS-RANK.json`` (when it saw the exit, to 20 ms; its error
line; the last lines of its stderr). The rank that then records the failure (the first to
claim it, :func:`train.stop.act.claim_failure`) reads the earliest reports and decides from the
root (:func:`train.stop.causes.root_report`: the first rank to fail whose own output is not
only the symptoms of a peer's death), so that a peer's "connection closed" after the root died
is its cascade, not a second cause, and the root's own error is the one recorded.

One file per failing rank per attempt, written once; one directory listing by each failing
rank: nothing per step, and a 1000-rank failure reads at most :data:`READ_LIMIT` reports.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from train.runfiles import FAILURES, atomic_write, make_dirs

__all__ = ["READ_LIMIT", "failed_before_term", "read_reports", "report_dir", "write_report"]

log = logging.getLogger("train.command.supervisor")

#: the earliest reports read (the root is among the first ranks to fail)
READ_LIMIT = 16


def report_dir(run_dir: Path, job_id: str | None, attempt: int | str) -> Path:
    return Path(run_dir) / FAILURES / f"{job_id}-{attempt}.ranks"


def write_report(
    run_dir: Path,
    job_id: str | None,
    attempt: int | str,
    rank: int,
    exited_at: float,
    error: str,
    lines: list[str],
    signal: str | None = None,
) -> None:
    """This rank's report (written whole: a temporary file renamed); a failure to write is
    logged, never raised (the failure is recorded either way). ``signal``: the signal that
    killed the command (``SIGTERM``), if one did."""
    folder = report_dir(run_dir, job_id, attempt)
    name = f"{round(exited_at * 1000):015d}-{rank}.json"
    data: dict[str, Any] = {
        "rank": rank,
        "time": exited_at,
        "error": error,
        "stderr_tail": lines[-40:],
    }
    if signal:
        data["signal"] = signal
    try:
        make_dirs(run_dir, FAILURES, folder.name)  # never through a planted link
        atomic_write(folder / name, json.dumps(data), durable=False)
    except OSError as exc:
        log.warning("cannot write rank %d's failure report in %s (%s)", rank, folder, exc)


def read_reports(
    run_dir: Path, job_id: str | None, attempt: int | str, limit: int = READ_LIMIT
) -> list[dict[str, Any]]:
    """The earliest ``limit`` reports of the attempt (by the time in their names); a damaged
    or foreign one is skipped."""
    folder = report_dir(run_dir, job_id, attempt)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and n[0].isdigit())
    except OSError:
        return []
    out = []
    for name in names[:limit]:
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out.append(data)
    return out


def failed_before_term(run_dir: Path, job_id: str | None, attempt: int | str) -> bool:
    """Whether a rank's command of the attempt failed other than by a TERM (one listing): a
    rank reports before its task ends, so before srun's TERM to the others; a command killed by
    a TERM (srun's, or an operator's ``scancel --signal=TERM``) is that TERM's effect, not the
    failure it would answer."""
    return any(r.get("signal") != "SIGTERM" for r in read_reports(run_dir, job_id, attempt))
