"""The hang claim: which process took charge of a hung attempt (torch-free).

The first hang watcher to create ``RUN_DIR/hangs/JOB-ATTEMPT/claimed`` (an exclusive create on
the shared run directory, links refused) records and requeues the hang (:mod:`train.hang`); every
other stopper of that attempt asks :func:`hang_claimed` and stands down: a rank that comes back
to life afterwards (Slurm's SIGCONT at the requeue, a peer's 'connection closed') must not record
a failure or a stop of its own (:func:`train.stop.act.ended_elsewhere`). It lives beside the stop
because the stop path reads it; the watcher, above the stop, writes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from train.runfiles import HANGS, open_fd

__all__ = ["attempt_name", "claim_hang", "hang_claimed", "hang_dir", "is_claimed"]

_CLAIM = "claimed"


def attempt_name(job_id: str | None, attempt: int | str) -> str:
    """``JOB-ATTEMPT``: ATTEMPT is the restart count, or ``DistEnv.attempt`` (``2.1``: a
    restart in place)."""
    return f"{job_id or 'local'}-{attempt}"


def hang_dir(run_dir: Path | str, name: str) -> Path:
    """``RUN_DIR/hangs/NAME``: one attempt's hang record (NAME from :func:`attempt_name`)."""
    return Path(run_dir) / HANGS / name


def is_claimed(hangs: Path) -> bool:
    """Whether the hang of the attempt whose record is ``hangs`` was claimed."""
    return (hangs / _CLAIM).exists()


def hang_claimed(run_dir: Path | str, job_id: str | None, attempt: int | str) -> bool:
    """True once a watcher took charge of a hang in this attempt (job, ``DistEnv.attempt``)."""
    return is_claimed(hang_dir(run_dir, attempt_name(job_id, attempt)))


def claim_hang(hangs: Path) -> bool:
    """Claim the hang of the attempt whose record is ``hangs`` (an existing folder): True for
    the one process that created the claim, False when another one did."""
    try:
        os.close(open_fd(hangs / _CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
