"""Requeue policy: what a run does once it stops (torch-free).

Call :func:`request_requeue` on every rank after the checkpoint is written and all ranks met at a
barrier. Rank 0 (for a failure: the first failing rank, :func:`claim_failure`) classifies the stop
(:mod:`train.stops`), records the event in ``RUN_DIR/events.jsonl`` (:mod:`train.history`),
checks the budgets of ``requeue:`` and requeues the job with ``scontrol requeue`` (through
:mod:`cluster.client`, imported lazily) or, where scontrol is unavailable, returns
:data:`REQUEUE_EXIT_CODE` for the batch script to requeue.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

from cluster.errors import BadInputError
from train import stops
from train.history import BudgetConfig, RunHistory
from train.quarantine import device_fault, exclude
from train.watchdog import hang_claimed

__all__ = [
    "BUDGET_EXHAUSTED_EXIT_CODE",
    "REQUEUE_EXIT_CODE",
    "claim_failure",
    "describe_failure",
    "failure_claimed",
    "request_requeue",
]

log = logging.getLogger(__name__)

# EX_TEMPFAIL: "stopped on purpose, run me again". Batch scripts requeue on this code.
REQUEUE_EXIT_CODE = 75
# A requeue budget is spent: stop for good (never requeue on this code).
BUDGET_EXHAUSTED_EXIT_CODE = 3

_EVENT_OF_KIND = {
    "preemption": "preempted",
    "preempted": "preempted",
    "timeout": "timeout",
    "failure": "failure",
    "cancel": "cancelled",
    "hang": "hang",  # the hang watchdog (train.watchdog)
}


class _Env(Protocol):
    """The part of :class:`train.env.DistEnv` used here."""

    @property
    def is_main(self) -> bool: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def restart_count(self) -> int: ...
    @property
    def world_size(self) -> int: ...


class RequeueSettings(BudgetConfig, Protocol):
    """The part of :class:`train.config.RequeueConfig` used here."""

    @property
    def signal_delay_s(self) -> int: ...


def describe_failure(exc: BaseException, where: str) -> str:
    """Log a failure in training (``where`` says what failed) and return its one-line text for
    the ``failure`` event; the caller then requeues it (:func:`request_requeue`, ``"failure"``).

    Bad input (:class:`cluster.errors.BadInputError`) is re-raised instead: a requeue would fail the
    same way.
    """
    if isinstance(exc, BadInputError):
        raise exc
    what = f"{type(exc).__name__}: {exc}"
    log.error("%s: %s", where, what, exc_info=log.isEnabledFor(logging.DEBUG))
    return what


def _failure_marker(run_dir: Any, job_id: str | None, restart_count: int) -> Path:
    return Path(run_dir) / ".failures" / f"{job_id}-{restart_count}"


def failure_claimed(run_dir: Any, job_id: str | None, restart_count: int) -> bool:
    """Whether some rank already claimed the failure of attempt (job, restart)."""
    return _failure_marker(run_dir, job_id, restart_count).exists()


def claim_failure(run_dir: Any, job_id: str, restart_count: int, is_main: bool) -> bool:
    """True for the first rank of attempt (job, restart) to claim its failure (an exclusive
    create of ``RUN_DIR/.failures/JOB-RESTART`` on the shared run directory)."""
    marker = _failure_marker(run_dir, job_id, restart_count)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        log.warning("cannot claim the failure in %s (%s)", marker.parent, exc)
        return is_main
    os.close(fd)
    return True


LOCAL_SUPERVISOR_ENV = "SLURM_TRAIN_LOCAL_SUPERVISOR"


def _local_stop(run_dir: Any) -> str:
    """Why the local launcher stops the ranks: ``RUN_DIR/.local-stop`` ("cancel"), or "".

    A launcher that is gone (killed: its ranks got their parent-death SIGTERM) restarts
    nothing either: that stop is recorded as a cancel too, not as a requeue nobody will do.
    """
    launcher = os.environ.get(LOCAL_SUPERVISOR_ENV, "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        return "cancel"
    try:
        return (Path(run_dir) / ".local-stop").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _node_failed(
    history: RunHistory,
    env: _Env,
    run_dir: Any,
    lost: dict[str, str],
    step: int | None,
    client: Any,
    error: str | None,
) -> int:
    """Slurm failed nodes under the job and requeued it itself (NODE_FAIL): record that, not a
    preemption or a failure of the training code (no budget spent), and keep the job off them."""
    nodes = sorted(lost)
    base = {"step": step, "restart_count": env.restart_count, "job_id": env.job_id}
    extra = {"error": error[:300]} if error else {}
    history.append("node_fail", **base, nodes=nodes, states=lost, **extra)
    log.error(
        "node failure: Slurm failed %s under job %s and requeued it", ",".join(nodes), env.job_id
    )
    exclude(run_dir, str(env.job_id), nodes, f"node failure at step {step}", step=step,
            restart_count=env.restart_count, client=client)  # fmt: skip
    return 0


def request_requeue(
    env: _Env,
    run_dir: Any,
    requeue_config: RequeueSettings,
    kind: str | None,
    *,
    step: int | None = None,
    client: Any = None,
    error: str | None = None,
    details: dict[str, Any] | None = None,
) -> int:
    """Record why the run stops, check the budgets and requeue; return the exit code.

    Call on every rank after the checkpoint is written and all ranks met at a barrier (for
    ``kind="failure"``: from the rank whose training raised, ``error`` saying what, ``details``
    more fields for the event, e.g. a command's exit code and stderr tail; in a Slurm
    job with several ranks the first failing rank, whichever it is, acts as rank 0). Rank 0
    classifies an unclassified ``"signal"`` with Slurm, appends the ``preempted``/``timeout``/
    ``failure`` event and then either ``budget_exhausted`` (returns
    :data:`BUDGET_EXHAUSTED_EXIT_CODE`, no requeue) or ``requeue``: ``scontrol requeue`` (returns
    0) or, where that is unavailable, :data:`REQUEUE_EXIT_CODE` for the batch script. Other
    ranks return 0 so that srun's exit code (the highest of all tasks) is rank 0's.
    A failure returns 1 instead of 0 (the job is requeued, this run still failed), and outside
    Slurm it is recorded but not turned into a requeue request. A ``cancel`` (plain ``scancel``:
    SIGTERM, the job already ending) is recorded as ``cancelled`` and returns 0, no requeue.
    """
    failed = kind == "failure"
    if kind != "hang" and hang_claimed(run_dir, env.job_id, env.restart_count):
        # the hang watchdog already recorded this attempt's end and requeued it
        log.warning("stop after a hang of this attempt: already recorded and requeued")
        return 1 if failed else 0
    if failed and env.job_id and env.world_size > 1:
        # Any rank may be the one that failed (and srun --kill-on-bad-exit ends the others
        # before rank 0 could learn of it): the first failing rank of this attempt records it.
        if not claim_failure(run_dir, env.job_id, env.restart_count, env.is_main):
            return 1
    elif not env.is_main:
        return 1 if failed else 0
    history = RunHistory(run_dir)
    job_id = env.job_id
    k = kind or "signal"
    if job_id and k in ("signal", "cancel", "failure"):
        if client is None:
            from cluster.client import SlurmClient  # lazy import, see module docstring

            client = SlurmClient(timeout=30)
        client = stops.AskedOnce(client)  # the node check and the classification: one show_job
        hosts = tuple(getattr(env, "hosts", ()) or ())
        lost = stops.node_failure(job_id, env.restart_count, hosts, client)
        if lost is not None:
            return _node_failed(history, env, run_dir, lost, step, client, error)
    if k in ("signal", "cancel") and job_id:
        # the guard does not know this run's restart count: ask again with it (a SIGTERM after
        # the grace time of a preemption Slurm already requeued is not a cancel)
        k = stops.classify_stop(
            job_id, requeue_config.signal_delay_s, client=client, restart_count=env.restart_count
        )
    elif k == "signal" and not job_id and _local_stop(run_dir) == "cancel":
        k = "cancel"  # the local launcher (jobs --executor local) says this SIGTERM cancels
    event = _EVENT_OF_KIND.get(k, "preempted")  # an unexplained signal counts as a preemption
    base = {"step": step, "restart_count": env.restart_count, "job_id": job_id}
    extra = {**(details or {}), **({"error": error[:300]} if error else {})}
    history.append(event, **base, kind=k, **extra)
    if event == "cancelled":
        log.warning("job %s was cancelled: checkpoint kept at step %s, not requeuing", job_id, step)
        return 0
    reason = history.check_budget(requeue_config)
    if reason is not None:
        history.append("budget_exhausted", **base, reason=reason)
        log.error("not requeuing: %s", reason)
        return BUDGET_EXHAUSTED_EXIT_CODE
    if job_id:
        try:
            if client is None:
                from cluster.client import SlurmClient  # lazy import, see module docstring

                client = SlurmClient(timeout=30)
            client.requeue(job_id)
        except Exception as exc:
            log.warning(
                "scontrol requeue %s failed (%s); exiting %d for the batch script to requeue",
                job_id,
                exc,
                REQUEUE_EXIT_CODE,
            )
            history.append("requeue", **base, via="exit_code", error=str(exc)[:200])
            return REQUEUE_EXIT_CODE
        history.append("requeue", **base, via="scontrol")
        log.warning(
            "job %s requeued after %s%s", job_id, event, "" if step is None else f" at step {step}"
        )
        node = getattr(env, "node_name", None)
        if failed and node and device_fault(error, (details or {}).get("stderr_tail")):
            exclude(run_dir, job_id, [node], f"device fault at step {step}", step=step,
                    restart_count=env.restart_count, client=client)  # fmt: skip
        return 1 if failed else 0
    if failed:
        return 1
    history.append("requeue", **base, via="exit_code")
    log.warning(
        "not under Slurm: exiting %d so the launcher can restart the run", REQUEUE_EXIT_CODE
    )
    return REQUEUE_EXIT_CODE
