"""Preemption and time-limit handling: a flag set by signals, agreed on at step boundaries.

The protocol (the trainer drives it; user code can too)::

    guard = PreemptionGuard((requeue.signal, "TERM")).install()   # handler only sets a flag
    for step in ...:
        train_step()
        if guard.should_stop(all_reduce_max):   # every rank, every step boundary: ranks agree
            ckpt.save(...); ckpt.wait()           # the checkpoint of the last completed step
            barrier()                             # all ranks have written their part
            return request_requeue(env, run_dir, requeue, guard.reason, step=step)

Slurm sends the job's ``--signal`` (USR2 by default: NCCL may use USR1) before the time limit
and, with ``preempt_send_user_signal``, at preemption; SIGTERM follows when the grace time ends.
Rank 0 tells the two apart with ``scontrol show job`` (:func:`classify_stop`), records the
event in ``RUN_DIR/events.jsonl``, checks the budgets and requeues the job with
``scontrol requeue`` (through :mod:`cluster.client`, imported lazily), or, where scontrol is
unavailable, returns :data:`REQUEUE_EXIT_CODE` for the batch script to requeue.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal, Protocol

from train.history import BudgetConfig, RunHistory

__all__ = [
    "BUDGET_EXHAUSTED_EXIT_CODE",
    "REQUEUE_EXIT_CODE",
    "PreemptionGuard",
    "RunHistory",
    "StopKind",
    "classify_from_job_info",
    "classify_stop",
    "install_early",
    "note_early_signal",
    "pop_early_signals",
    "request_requeue",
]

log = logging.getLogger(__name__)

# EX_TEMPFAIL: "stopped on purpose, run me again". Batch scripts requeue on this code.
REQUEUE_EXIT_CODE = 75
# A requeue budget is spent: stop for good (never requeue on this code).
BUDGET_EXHAUSTED_EXIT_CODE = 3

StopKind = Literal["preemption", "timeout", "cancel", "signal", "failure"]
_EVENT_OF_KIND = {
    "preemption": "preempted",
    "preempted": "preempted",
    "timeout": "timeout",
    "failure": "failure",
    "cancel": "cancelled",
}
_UNSET = {"", "none", "unknown", "n/a", "(null)"}


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


class _RequeueSettings(BudgetConfig, Protocol):
    @property
    def signal_delay_s(self) -> int: ...


# Stop signals that arrived before a PreemptionGuard was installed: (signal, time).
_EARLY: list[tuple[signal.Signals, float]] = []


def note_early_signal(signum: int, when: float | None = None) -> None:
    """Remember a stop signal received before the guard exists (for launchers' own handlers,
    e.g. ``jobs.launch``): the next :meth:`PreemptionGuard.install` turns it into a stop."""
    _EARLY.append((signal.Signals(signum), time.time() if when is None else when))


def pop_early_signals() -> list[signal.Signals]:
    """Take the stop signals remembered since :func:`install_early` (oldest first).

    For code that installs no :class:`PreemptionGuard` after ``install_early`` (e.g. a command
    entrypoint): it must pass them on (to its child) or act on them, else a SIGTERM that arrived
    during startup would be swallowed and the process would not stop.
    """
    taken = [s for s, _ in _EARLY]
    _EARLY.clear()
    return taken


def _early_handler(signum: int, frame: FrameType | None) -> None:
    note_early_signal(signum)


def install_early(signals: Sequence[str | int] = ("USR2", "TERM")) -> None:
    """Call first thing in a training process, before importing torch (main thread only).

    Slurm may send the time-limit signal up to a minute early, so a requeued job with a short
    limit can get it while Python is still importing torch; with the default action the task
    dies and the job FAILS instead of being requeued. These handlers only remember the signal;
    :meth:`PreemptionGuard.install` picks it up and the run stops (checkpoint + requeue) at its
    first step boundary. After the guard is uninstalled they remember (ignore) late repeats.
    Code that installs no guard afterwards must take them with :func:`pop_early_signals`.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for s in dict.fromkeys(_signum(x) for x in signals):
        signal.signal(s, _early_handler)


def _signum(sig: str | int | signal.Signals) -> signal.Signals:
    if isinstance(sig, signal.Signals):
        return sig
    if isinstance(sig, int):
        return signal.Signals(sig)
    name = sig.strip().upper()
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]


class PreemptionGuard:
    """Turns stop signals into a flag that all ranks agree on at step boundaries.

    ``job_id``/``signal_delay_s``/``is_main``: when given, :attr:`reason` on the main rank asks
    Slurm whether this is a preemption or the time limit (:func:`classify_stop`).
    """

    def __init__(
        self,
        signals: Sequence[str | int] = ("USR2", "TERM"),
        *,
        job_id: str | None = None,
        signal_delay_s: float = 90.0,
        is_main: bool = True,
    ) -> None:
        self.signals = tuple(dict.fromkeys(_signum(s) for s in signals))
        self.job_id = job_id
        self.signal_delay_s = signal_delay_s
        self.is_main = is_main
        self._flag = False
        self._received: signal.Signals | None = None
        self._received_at: float | None = None
        self._stopping = False
        self._reason: StopKind | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> PreemptionGuard:
        """Install the handlers (main thread only); returns self."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("signal handlers can only be installed from the main thread; skipped")
            return self
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        early = [(s, t) for s, t in _EARLY if s in self.signals]
        _EARLY.clear()
        if early and not self._flag:
            # a stop signal arrived during startup: honour it at the first step boundary
            self._received, self._received_at = early[0]
            self._flag = True
            log.warning("%s arrived during startup: stopping at the first step", early[0][0].name)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were installed before :meth:`install`."""
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: no logging, locks, I/O or collectives inside a signal handler.
        if not self._flag:
            self._received = signal.Signals(signum)
            self._received_at = time.time()
        self._flag = True

    def trigger(self, sig: str | int = "USR2") -> None:
        """Request a stop as if ``sig`` had arrived (tests, user code, a watchdog)."""
        self._handle(int(_signum(sig)), None)

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal (not yet agreed with other ranks)."""
        return self._flag

    @property
    def signal_name(self) -> str | None:
        """Name of the first stop signal this process received (``"SIGUSR2"``), if any."""
        return self._received.name if self._received is not None else None

    def should_stop(self, all_reduce_max: Callable[[int], int]) -> bool:
        """Whether any rank got a stop signal; every rank must call this at the same step.

        ``all_reduce_max`` reduces an int over ranks with MAX (``lambda x: x`` for one
        process); it runs every call so that ranks stay in lockstep.
        """
        agreed = int(all_reduce_max(1 if self._flag else 0)) > 0
        if agreed and not self._stopping:
            self._stopping = True
            log.warning(
                "stop requested (%s): checkpointing at this step boundary",
                self.signal_name or "signal on another rank",
            )
        return agreed

    @property
    def reason(self) -> StopKind | None:
        """``"preemption"``, ``"timeout"``, ``"cancel"`` or ``"signal"`` (unclassified)."""
        if not self._stopping and not self._flag:
            return None
        if self._reason is None:
            self._reason = "signal"
            if self.is_main and self.job_id:
                self._reason = classify_stop(self.job_id, self.signal_delay_s)
        return self._reason


def _parse_slurm_timestamp(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        # Slurm prints local time without a zone, e.g. 2026-11-22T10:40:00
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _time_limit_s(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        from cluster.timefmt import parse_slurm_time  # stdlib only; lazy like cluster.client

        seconds = parse_slurm_time(value.strip())
    except Exception:  # UNLIMITED parses to None; anything odd: unknown
        return None
    return float(seconds) if seconds is not None else None


def classify_from_job_info(
    info: Mapping[str, str],
    signal_delay_s: float,
    now: float | None = None,
    restart_count: int | None = None,
) -> Literal["preemption", "timeout", "cancel"]:
    """Why Slurm is stopping the job, from ``scontrol show job`` fields (pure).

    - PreemptTime set, or Restarts already above this run's restart count (Slurm requeued it
      when the grace time ended) -> ``preemption``;
    - job still RUNNING: EndTime within ``signal_delay_s + 60`` s -> ``timeout`` (Slurm may
      send the signal up to 60 s early), EndTime far away -> ``preemption`` (also a manual
      ``scancel --signal=USR2``: checkpoint and requeue);
    - job already ending (COMPLETING, CANCELLED, ...): its time limit reached -> ``timeout``,
      else ``cancel`` (a plain ``scancel`` sends SIGTERM: stop, never requeue).
    """
    now = time.time() if now is None else now
    margin = signal_delay_s + 60
    if _parse_slurm_timestamp(info.get("PreemptTime")) is not None:
        return "preemption"
    restarts = info.get("Restarts", "")
    if restart_count is not None and restarts.isdigit() and int(restarts) > restart_count:
        return "preemption"
    state = info.get("JobState", "RUNNING").strip().upper()
    if state == "TIMEOUT":
        return "timeout"
    if state in ("RUNNING", "SUSPENDED", "CONFIGURING", "PENDING", ""):
        end = _parse_slurm_timestamp(info.get("EndTime"))
        if end is not None and end - now <= margin:
            return "timeout"
        return "preemption"
    start = _parse_slurm_timestamp(info.get("StartTime"))
    limit = _time_limit_s(info.get("TimeLimit"))
    if start is not None and limit is not None and start + limit - now <= margin:
        return "timeout"
    return "cancel"


def classify_stop(
    job_id: str,
    signal_delay_s: float,
    *,
    client: Any = None,
    now: float | None = None,
    restart_count: int | None = None,
) -> StopKind:
    """Ask Slurm why job ``job_id`` is being stopped; ``"signal"`` if Slurm cannot be asked."""
    try:
        if client is None:
            from cluster.client import SlurmClient  # lazy: train does not need cluster to import

            client = SlurmClient(timeout=10)
        info = client.show_job(job_id)
    except Exception as exc:  # no scontrol in a container, controller down, ...
        log.warning("cannot ask Slurm about job %s (%s); stop kind unknown", job_id, exc)
        return "signal"
    kind = classify_from_job_info(info, signal_delay_s, now, restart_count)
    log.warning("job %s: stop is a %s", job_id, kind)
    return kind


def describe_failure(exc: BaseException, where: str) -> str:
    """Log a failure in training (``where`` says what failed) and return its one-line text for
    the ``failure`` event; the caller then requeues it (:func:`request_requeue`, ``"failure"``).

    Bad input (an error with ``exit_code == 2``) is re-raised instead: a requeue would fail the
    same way.
    """
    if getattr(exc, "exit_code", 1) == 2:
        raise exc
    what = f"{type(exc).__name__}: {exc}"
    log.error("%s: %s", where, what, exc_info=log.isEnabledFor(logging.DEBUG))
    return what


def _claim_failure(run_dir: Any, job_id: str, restart_count: int, is_main: bool) -> bool:
    """True for the first rank of attempt (job, restart) to claim its failure (an exclusive
    create of ``RUN_DIR/.failures/JOB-RESTART`` on the shared run directory)."""
    marker = Path(run_dir) / ".failures" / f"{job_id}-{restart_count}"
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


def request_requeue(
    env: _Env,
    run_dir: Any,
    requeue_config: _RequeueSettings,
    kind: str | None,
    *,
    step: int | None = None,
    client: Any = None,
    error: str | None = None,
) -> int:
    """Record why the run stops, check the budgets and requeue; return the exit code.

    Call on every rank after the checkpoint is written and all ranks met at a barrier (for
    ``kind="failure"``: from the rank whose training raised, ``error`` saying what; in a Slurm
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
    if failed and env.job_id and env.world_size > 1:
        # Any rank may be the one that failed (and srun --kill-on-bad-exit ends the others
        # before rank 0 could learn of it): the first failing rank of this attempt records it.
        if not _claim_failure(run_dir, env.job_id, env.restart_count, env.is_main):
            return 1
    elif not env.is_main:
        return 1 if failed else 0
    history = RunHistory(run_dir)
    job_id = env.job_id
    k = kind or "signal"
    if k in ("signal", "cancel") and job_id:
        # the guard does not know this run's restart count: ask again with it (a SIGTERM after
        # the grace time of a preemption Slurm already requeued is not a cancel)
        k = classify_stop(
            job_id, requeue_config.signal_delay_s, client=client, restart_count=env.restart_count
        )
    event = _EVENT_OF_KIND.get(k, "preempted")  # an unexplained signal counts as a preemption
    base = {"step": step, "restart_count": env.restart_count, "job_id": job_id}
    history.append(event, **base, kind=k, **({"error": error[:300]} if error else {}))
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
        log.warning("job %s requeued after %s at step %s", job_id, event, step)
        return 1 if failed else 0
    if failed:
        return 1
    history.append("requeue", **base, via="exit_code")
    log.warning(
        "not under Slurm: exiting %d so the launcher can restart the run", REQUEUE_EXIT_CODE
    )
    return REQUEUE_EXIT_CODE
