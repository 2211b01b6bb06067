"""Carrying out a stop decision: events, budgets, ``scontrol requeue`` or exit 75, quarantine,
claims (torch-free). The protocol is drawn in :mod:`train.stop`.

:func:`request_requeue` is the whole stop for code that has already saved (the run session, the
hang watcher): who acts (:func:`acts_for_attempt`), the facts (:func:`train.stop.facts.gather`),
the decision (:func:`train.stop.decision.decide`) and :func:`carry_out`. The command supervisor
calls the same three pieces with its command's exit in between (:mod:`train.command.stop`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from cluster import BadInputError
from train.history import RunHistory
from train.runfiles import FAILURES, make_dirs
from train.stop.causes import decide_cause, rules_of, signature
from train.stop.claims import hang_claimed
from train.stop.decision import (
    CHAIN_NOTE,
    REQUEUE_EXIT_CODE,
    Decision,
    Trigger,
    decide,
)
from train.stop.facts import StopFacts, gather
from train.stop.signals import term_received_at
from train.stop.stopenv import StopEnv

if TYPE_CHECKING:
    from cluster import Slurm
    from train.spec import RequeueConfig

__all__ = [
    "acts_for_attempt",
    "carry_out",
    "claim_failure",
    "describe_failure",
    "ended_elsewhere",
    "failure_claimed",
    "failure_details",
    "record",
    "request_requeue",
    "stop_attempt",
]

log = logging.getLogger(__name__)

_KNOWN_KINDS = ("preemption", "timeout", "cancel", "failure", "hang")


def describe_failure(exc: BaseException, where: str) -> str:
    """Log a failure in training (``where`` says what failed) and return its one-line text for
    the ``failure`` event; the caller then stops with trigger ``"failure"``.

    Bad input (:class:`cluster.errors.BadInputError`) is re-raised instead: a requeue would fail the
    same way.
    """
    if isinstance(exc, BadInputError):
        raise exc
    what = f"{type(exc).__name__}: {exc}"
    log.error("%s: %s", where, what, exc_info=log.isEnabledFor(logging.DEBUG))
    return what


def failure_details(exc: BaseException) -> dict[str, Any]:
    """The event fields of a failure in training beyond its one line: the last lines of its
    traceback (``traceback``: where it was raised, read line by line for its cause) and its
    ``signature`` (exception and location: a deterministic crash is the same one again)."""
    lines = [
        ln for chunk in traceback.format_exception(exc) for ln in chunk.splitlines() if ln.strip()
    ][-30:]
    return {"traceback": lines, "signature": signature([f"{type(exc).__name__}: {exc}", lines])}


#: how long a rank whose failure is only a peer's death (connection closed, a collective timed
#: out: the cascade) leaves the claim to the root, before it claims the failure itself
ROOT_WAIT_S = 10.0
#: how long it still looks for the root's claim once srun ends the step (its SIGTERM): none.
#: The root claims (an exclusive create, synchronous on the file server) before it exits, and a
#: cascade of a lost connection comes after that exit, as srun's SIGTERM does; this rank's own
#: claim is an exclusive create too, so a root's claim not yet seen here still wins it. Left to
#: a grace would be only a root that is alive at a SIGTERM not srun's (a cancel, a preemption)
#: and claims later than its peer lost its connection to it.
STEP_ENDING_GRACE_S = 0.0


class _StepEnding:
    """Whether srun is ending this step: the SIGTERM it sends every other task the moment one
    task exits badly (``--kill-on-bad-exit``; KillWait later, SIGKILL). Installed for the wait
    only, in the main thread only, over a Python handler (which it calls too) or an ignored
    SIGTERM; under the default action the signal ends the process as before."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _StepEnding:
        # srun's SIGTERM may have come before the wait: during the collective that failed
        self.at = term_received_at()
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL or previous is None:
            return self
        self._previous = previous
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.at is None:
            self.at = time.monotonic()
        if callable(self._previous):
            self._previous(signum, frame)

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)


def _left_to_the_root(env: StopEnv, run_dir: Path | str, texts: tuple[object, ...],
                      rules: Any) -> bool:  # fmt: skip
    """A failing rank of several whose own texts are only the symptoms of a peer's death: wait
    (within :data:`ROOT_WAIT_S`) for the root, still alive when it claims, to claim the
    attempt's failure; True once another rank did (this one records nothing: its failure is
    the cascade, never the cause recorded). A root that died without a claim (killed) leaves it
    to this rank: at once when srun ends the step (the root's task exited, and a root that
    claimed did so before it exited: :data:`STEP_ENDING_GRACE_S` says why no grace), else after
    the wait."""
    if not (env.job_id and env.world_size > 1) or not decide_cause(texts, rules).cascade:
        return False
    deadline = time.monotonic() + ROOT_WAIT_S
    with _StepEnding() as ending:
        while time.monotonic() < deadline:
            if failure_claimed(run_dir, env.job_id, env.attempt):
                return True
            if ending.at is not None:
                deadline = min(deadline, ending.at + STEP_ENDING_GRACE_S)
            time.sleep(0.05)
    return failure_claimed(run_dir, env.job_id, env.attempt)


def _failure_marker(run_dir: Path | str, job_id: str | None, attempt: int | str) -> Path:
    return Path(run_dir) / FAILURES / f"{job_id}-{attempt}"


def failure_claimed(run_dir: Path | str, job_id: str | None, attempt: int | str) -> bool:
    """Whether some rank already claimed the failure of attempt (job, ``DistEnv.attempt``)."""
    return _failure_marker(run_dir, job_id, attempt).exists()


def claim_failure(run_dir: Path | str, job_id: str, attempt: int | str, is_main: bool) -> bool:
    """True for the first rank of attempt (job, ``DistEnv.attempt``) to claim its failure (an
    exclusive create of ``RUN_DIR/.failures/JOB-ATTEMPT`` on the shared run directory)."""
    marker = _failure_marker(run_dir, job_id, attempt)
    try:
        make_dirs(run_dir, FAILURES)  # never through a planted link
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        log.warning("cannot claim the failure in %s (%s)", marker.parent, exc)
        return is_main
    os.close(fd)
    return True


def acts_for_attempt(env: StopEnv, run_dir: Path | str, trigger: str) -> bool:
    """Whether this process decides the stop of its attempt: rank 0, or for a failure of a
    multi-rank Slurm job the first failing rank, whichever it is (srun --kill-on-bad-exit ends
    the others before rank 0 could learn of it)."""
    if trigger == "failure" and env.job_id and env.world_size > 1:
        return claim_failure(run_dir, env.job_id, env.attempt, env.is_main)
    return env.is_main


def ended_elsewhere(env: StopEnv, run_dir: Path | str, trigger: str | None = None) -> str | None:
    """``"hang"`` or ``"failure"`` when another process has already decided and recorded how
    this attempt ends (a node's hang watcher; the first rank that failed), else None.

    A stop that comes after it (Slurm's TERM at the watcher's requeue, srun ending the step of
    a failed rank, a peer's lost connection) is not a stop of its own: nothing to record, and
    nothing to save (a checkpoint needs every rank, and one of them is frozen or gone).
    ``trigger``: this process's own reason, which never counts against itself."""
    if trigger != "hang" and hang_claimed(run_dir, env.job_id, env.attempt):
        return "hang"
    if trigger != "failure" and env.job_id and failure_claimed(run_dir, env.job_id, env.attempt):
        return "failure"
    return None


def attempt_fields(env: StopEnv, step: int | None) -> dict[str, Any]:
    """The fields every event of this attempt carries."""
    base: dict[str, Any] = {"step": step, "restart_count": env.restart_count, "job_id": env.job_id}
    if env.in_place:
        base["in_place"] = env.in_place
    if env.submission:
        base["submission"] = env.submission
    return base


def _client(client: Slurm | None) -> Slurm:
    if client is None:
        from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

        client = slurm_client(timeout=30, shielded=True)
    return client


def record(
    decision: Decision,
    history: RunHistory,
    base: dict[str, Any],
    facts: StopFacts,
    **fields: Any,
) -> None:
    """The decision's events, before anything else happens: the stop's event (``fields`` added:
    kind, signal, error, ...), then ``budget_exhausted`` when it spends a budget."""
    if decision.event is None:
        log.warning("%s", decision.note)
        return
    if decision.event == "node_fail":
        history.append("node_fail", **base, nodes=sorted(facts.nodes_lost),
                       states=dict(facts.nodes_lost), **fields)  # fmt: skip
        log.error("node failure: %s", decision.note)
    else:
        if decision.kind == "failure":
            fields = {"failure_class": facts.failure_class, "cause": facts.failure_why, **fields}
        history.append(decision.event, **base, kind=decision.kind, action=decision.action,
                       **fields)  # fmt: skip
    if decision.exhausted is not None:
        history.append("budget_exhausted", **base, reason=decision.exhausted)
        log.error("not requeuing: %s", decision.exhausted)


def carry_out(
    decision: Decision,
    history: RunHistory,
    base: dict[str, Any],
    run_dir: Path | str,
    *,
    client: Slurm | None = None,
    requeued_by: Callable[[], str | None] | None = None,
) -> int:
    """Requeue as decided (after :func:`record`, once the run has saved and its processes are
    done), keep the job off the decided nodes; returns the deciding process's exit code.

    ``requeued_by``: asked only when Slurm refuses the requeue, who requeued the job already
    (a command that requeues itself, Lightning; Slurm): Slurm refuses a second requeue of a
    requeued job ("Job is pending execution", its restart count unchanged), so no query is
    needed before the requeue, and the job leaves its nodes one Slurm call after the stop."""
    job_id = base.get("job_id")
    if decision.event == "cancelled":
        log.warning("job %s was cancelled: checkpoint kept at step %s, not requeuing",
                    job_id, base.get("step"))  # fmt: skip
    exit_code = decision.exit_code
    if decision.requeued_by is not None and decision.event != "node_fail":
        history.append("requeue", **base, via=decision.requeued_by)
    elif decision.action == "requeue" and job_id:
        try:
            client = _client(client)
            client.requeue(str(job_id))
        except Exception as exc:
            by = requeued_by() if requeued_by is not None else None
            if by is None:
                # what happened, not what is hoped: the batch script retries after the step
                # (train.stop.step: the requeue, or requeue_failed again) on this exit code
                log.warning("scontrol requeue %s failed (%s); exiting %d for the batch script "
                            "to requeue", job_id, exc, REQUEUE_EXIT_CODE)  # fmt: skip
                history.append("requeue_failed", **base, by="rank", error=str(exc)[:200],
                               then=f"exit {REQUEUE_EXIT_CODE}")  # fmt: skip
                return REQUEUE_EXIT_CODE
            log.warning("job %s was requeued already (by the %s): not requeuing it again",
                        job_id, by)  # fmt: skip
            history.append("requeue", **base, via=by)
        else:
            history.append("requeue", **base, via="scontrol")
            step = base.get("step")
            log.warning("job %s requeued after %s%s", job_id, decision.event,
                        "" if step is None else f" at step {step}")  # fmt: skip
    elif decision.action == "restart_in_place":
        log.warning("%s: the batch script restarts the step in this allocation (no requeue)",
                    decision.event)  # fmt: skip
    elif decision.action == "exit_requeue" and decision.note == CHAIN_NOTE:
        history.append("requeue", **base, via="chain")
        log.warning("a link of a chain: exiting %d, the next link resumes the run",
                    REQUEUE_EXIT_CODE)  # fmt: skip
    elif decision.action == "exit_requeue":
        # what happens here: exit 75 hands the restart to the launcher (no Slurm job: the
        # local executor restarts on it; jobs follow says so)
        history.append("requeue", **base, via="exit_code")
        log.warning("not under Slurm: exiting %d so the launcher can restart the run",
                    REQUEUE_EXIT_CODE)  # fmt: skip
    if decision.exhausted and job_id and exit_code != 0:
        # the run ends for good: Slurm must not requeue the job either (26.05 requeues a job of
        # --requeue=expedite that exits non-zero, held: REQUEUE_HOLD instead of FAILED)
        try:
            _client(client).forbid_requeue(str(job_id))
        except Exception as exc:  # the job ends as it would have: at worst held, never lost
            log.warning("scontrol update JobId=%s Requeue=0 failed: %s", job_id, exc)
    if decision.exclude and job_id and decision.requeues:
        from train.stop.quarantine import exclude

        step = base.get("step")
        at = "" if step is None else f" at step {step}"
        exclude(run_dir, str(job_id), decision.exclude, f"{decision.exclude_reason}{at}",
                step=step, restart_count=int(base.get("restart_count") or 0),
                client=_client(client))  # fmt: skip
    return exit_code


def stop_attempt(
    env: StopEnv,
    run_dir: Path | str,
    requeue_config: RequeueConfig,
    kind: str | None,
    *,
    step: int | None = None,
    client: Slurm | None = None,
    error: str | None = None,
    details: dict[str, Any] | None = None,
    suspects: tuple[str, ...] = (),
    on_decision: Callable[[Decision], None] | None = None,
    signal: str | None = None,
) -> tuple[int, Decision | None]:
    """The whole stop of a process that has saved: (its exit code, the decision if this process
    made it).

    Call on every rank after the checkpoint is written and all ranks met at a barrier (for
    ``kind="failure"``: from the rank whose training raised, ``error`` saying what, ``details``
    more fields for the event). ``kind``: ``None``/``"signal"`` (a stop signal: Slurm says
    why), or a kind the caller knows (``preemption``, ``timeout``, ``cancel``, ``failure``,
    ``hang``). The deciding process (:func:`acts_for_attempt`) gathers the facts, decides and
    carries it out; the others return 0 (1 for a failure) so that srun's exit code (the highest
    of all tasks) is the decider's.
    """
    trigger = cast(Trigger, kind if kind in _KNOWN_KINDS else "signal")
    failed = trigger == "failure"
    ended = ended_elsewhere(env, run_dir, trigger)
    if ended == "hang":
        log.warning("stop after a hang of this attempt: already recorded and requeued")
        return (1 if failed else 0), None
    details = dict(details or {})
    texts = (error, details.get("stderr_tail"), details.get("traceback"))
    rules = rules_of(requeue_config.failure_rules)
    if failed and ended is None and _left_to_the_root(env, run_dir, texts, rules):
        log.warning("%s: the cascade of another rank's failure (recorded by that rank)", error)
        return 1, None
    if not acts_for_attempt(env, run_dir, trigger):
        return (1 if failed else 0), None
    if failed and "signature" not in details:
        details["signature"] = signature(texts)
    history = RunHistory(run_dir)
    facts = gather(
        trigger,
        job_id=env.job_id,
        restart_count=env.restart_count,
        run_dir=run_dir,
        signal_delay_s=requeue_config.signal_delay_s,
        hosts=env.hosts,
        node=env.node_name,
        client=client,
        error_texts=texts,
        suspects=suspects,
        rules=rules,
        failure_claimed=ended == "failure",
        in_place=env.in_place_supervised,
        signal=signal,
        # a stop signal is decided here after every rank saved and met at a barrier
        peers_met=trigger not in ("failure", "hang"),
        slurm_release=env.slurm_release,
    )
    decision = decide(
        trigger,
        facts,
        history.budget_counts(env.job_id, env.restart_count, env.submission),
        requeue_config,
    )
    if on_decision is not None:
        on_decision(decision)
    base = attempt_fields(env, step)
    extra = {**details, **({"error": error[:300]} if error else {})}
    if decision.event == "node_fail" and error:
        extra = {"error": error[:300]}
    record(decision, history, base, facts, **extra)
    return carry_out(decision, history, base, run_dir, client=client), decision


def request_requeue(
    env: StopEnv,
    run_dir: Path | str,
    requeue_config: RequeueConfig,
    kind: str | None,
    **kwargs: Any,
) -> int:
    """:func:`stop_attempt`'s exit code (the same arguments)."""
    return stop_attempt(env, run_dir, requeue_config, kind, **kwargs)[0]
