"""The stop decision: (trigger, facts, history, budgets) -> what happens (pure, torch-free).

Every path that ends an attempt asks :func:`decide` and nothing else: the run session (the
built-in trainer and ``entrypoint.function``), the command supervisor, the hang watcher and the
local executor. The facts come from :mod:`train.stop.facts` (one ``scontrol show job`` per stop),
the decision is carried out by :mod:`train.stop.act`. The whole protocol is drawn once, in
:mod:`train.stop`. The table is tested row by row (tests/unit/train/test_stop_decision.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from train import runfiles
from train.history import over_budget
from train.stop.facts import StopFacts

if TYPE_CHECKING:
    from train.spec import RequeueConfig

__all__ = [
    "BUDGET_EXHAUSTED_EXIT_CODE",
    "CHAIN_NOTE",
    "EVENT_OF_KIND",
    "REQUEUE_EXIT_CODE",
    "Action",
    "Decision",
    "Trigger",
    "decide",
]

# EX_TEMPFAIL: "stopped on purpose, run me again". Batch scripts and launchers requeue on it.
REQUEUE_EXIT_CODE = 75
#: The note of an exit_requeue in a link of a chain (jobs.chain): the next link resumes the run.
CHAIN_NOTE = "chain: the next link resumes the run"
# A requeue budget is spent: stop for good (never requeue on this code).
BUDGET_EXHAUSTED_EXIT_CODE = 3

#: What started the stop: a stop signal the ranks agreed on (the job's requeue signal or TERM,
#: with an optional kind a caller already knows), a failure of the training code or command,
#: or a hang the watcher claimed.
Trigger = Literal["signal", "preemption", "timeout", "cancel", "failure", "hang"]

#: requeue: ``scontrol requeue`` (Slurm); exit_requeue: exit 75 for the launcher to restart;
#: restart_in_place: the batch script starts a new step in the same allocation (no queue);
#: none: nobody here requeues (a cancel, a spent budget, Slurm or the command already did, or
#: the launcher restarts a failed process itself).
Action = Literal["requeue", "exit_requeue", "restart_in_place", "none"]

#: A stop's kind -> the event recorded in ``events.jsonl``, from the one table of event kinds
#: (:data:`train.runfiles.EVENT_KINDS`; "requeued" from outside is budgeted as a preemption).
EVENT_OF_KIND: Mapping[str, str] = runfiles.EVENT_OF_KIND


@dataclass(frozen=True)
class Decision:
    """What to do at one stop (see :func:`decide`)."""

    kind: str  # preemption, timeout, cancel, failure, hang, node_fail, or "" (already handled)
    event: str | None  # the event to record, None when this attempt's end is already recorded
    action: Action
    exit_code: int  # of the deciding process (others: 0, or 1 for a failure)
    exhausted: str | None = None  # why a budget is spent (a budget_exhausted event follows)
    requeued_by: str | None = None  # "command" or "slurm": requeued already, not again by us
    exclude: tuple[str, ...] = ()  # nodes to keep the requeued job off
    exclude_reason: str = ""
    save: bool = True  # whether a supervised command gets its save signal (not at a cancel)
    note: str = ""

    @property
    def requeues(self) -> bool:
        """Whether the run goes on in a later attempt (requeued by us, the launcher or others)."""
        return self.action != "none" or self.requeued_by is not None


def _kind(trigger: Trigger, facts: StopFacts) -> str:
    if trigger in ("failure", "hang", "preemption", "timeout"):
        return trigger
    if trigger == "cancel" and facts.executor != "slurm":
        return "cancel"  # a caller that knows; under Slurm a cancel is checked with Slurm
    if facts.executor in ("local", "none"):
        # the local launcher writes RUN_DIR/.local-stop for a cancel (or is gone); any other
        # signal, TERM included, is its requeue request; a plain process exits 75 for
        # whoever launched it
        return "cancel" if facts.local_cancel else "preemption"
    # Slurm: what Slurm says (a stop it cannot explain counts as a preemption, never a cancel)
    return facts.slurm_kind if facts.slurm_kind != "unknown" else "preemption"


def _step_ending(trigger: Trigger, facts: StopFacts) -> bool:
    """A TERM while Slurm runs the job on, neither preempted nor near its time limit, under a
    batch script that restarts failed steps, decided before the ranks could meet (a command's
    supervisor): srun is ending the step because a rank died (--kill-on-bad-exit), not a
    preemption. Where every rank met at a barrier after the signal (the run session decides
    after its save) no rank died, and so where a command's supervisor finds no rank's report of
    a failed command (``no_rank_failed``): such a TERM (an operator's ``scancel --signal=TERM``)
    is a stop like the requeue signal, saved and requeued (README)."""
    return (
        trigger == "signal"
        and not facts.peers_met
        and not facts.no_rank_failed
        and facts.executor == "slurm"
        and facts.in_place
        and facts.signal == "SIGTERM"
        and facts.slurm_kind in ("preemption", "unknown")
        and not facts.preempt_evidence
    )


def _slurm_requeues(facts: StopFacts) -> bool:
    """Slurm preempted this job (PreemptTime set) on a release that requeues a preempted job
    itself (24.11+): our own ``scontrol requeue`` would be a second one (24.11.5 then ends the
    next run too). A stop Slurm cannot explain (no PreemptTime) is still ours to requeue."""
    info = facts.job_info or {}
    preempted = str(info.get("PreemptTime", "")).strip().lower() not in ("", "none", "unknown")
    return facts.executor == "slurm" and facts.slurm_requeues_preempted and preempted


def _no_progress(
    kind: str, facts: StopFacts, counts: Mapping[str, int], budgets: RequeueConfig
) -> str | None:
    """Why a failure or a hang must not restart the run again: the last N restarts all resumed
    from the checkpoint a restart would resume from now (none of them saved a newer one)."""
    if kind not in ("failure", "hang") or facts.checkpoint_step is None:
        return None
    stalled, at = int(counts.get("stalled_restarts", 0)), int(counts.get("stalled_step", -1))
    limit = budgets.max_restarts_without_progress
    if at < 0 or stalled < limit or facts.checkpoint_step > at:
        return None
    return (
        f"no checkpoint progress: {stalled} consecutive restarts resumed from step {at} and "
        f"none saved a newer checkpoint; not restarting (requeue.max_restarts_without_progress="
        f"{limit})"
    )


def decide(
    trigger: Trigger, facts: StopFacts, counts: Mapping[str, int], budgets: RequeueConfig
) -> Decision:
    """The one stop decision (pure). ``counts``: events recorded so far (``RunHistory.counts``).

    ======================================  ============  ======================================
    facts / trigger                         event         action (exit code)
    ======================================  ============  ======================================
    hang already claimed, other trigger     (none)        none (0; 1 for a failure)
    failure already claimed, a stop signal  (none)        none (1)
    TERM, job running, not preempted,       (none)        none (1): a rank died, srun ends the
      under an in-place batch script,                     step; the batch script decides
      the ranks have not met since,
      a command: a rank reported a failure
    ... the ranks met after it (saved), or  preempted     requeue (0): an operator's TERM
      no command reported a failure
    Slurm failed our nodes (NODE_FAIL)      node_fail     none: Slurm requeued (0); exclude them
    a failure, a node of ours down already  node_fail     requeue (0), excluding it
    cancel (scancel, local cancel)          cancelled     none (0); a command is stopped, no save
    preemption / timeout / failure / hang   its event     within budget: requeue (Slurm: 0, 1 for
                                                          a failure), exit 75 (no Slurm), or none
                                                          for a failure a launcher restarts (1)
    ... over its budget                     + budget_     none (3); a command still saves first
                                              exhausted
    failure / hang, the newest checkpoint   + budget_     none (3): requeue.max_restarts_without_
      is the one the last N restarts          exhausted     progress consecutive restarts made
      resumed from                                          no checkpoint progress
    ... already requeued (command, Slurm)   + requeue     none (0; 1 for a failure)
    preemption (PreemptTime) on a release   preempted     none (0): Slurm requeues it (24.11+)
      that requeues preempted jobs itself   + requeue
    ... a link of a chain (requeue.mode     its event     exit_requeue (75): the next link of
      chain), Slurm                                       the chain resumes (no scontrol)
    failure / hang under an in-place        its event     restart_in_place while
      batch script, no node to exclude                    requeue.max_restarts_in_place lasts
    ======================================  ============  ======================================

    ``counts`` are scoped (:func:`train.history.budget_counts`): stops of this submission,
    ``restart_in_place`` of this allocation, ``stalled_restarts`` (at ``stalled_step``).
    A failure spends the budget of its class (train.stop.causes): an error of the code or config
    is not retried (max_user_failures=0). A hang excludes its suspect nodes, a failure with a
    device fault its own node: both go through the queue then, to other nodes.
    """
    if facts.hang_claimed and trigger != "hang":
        return Decision(
            kind="",
            event=None,
            action="none",
            exit_code=1 if trigger == "failure" else 0,
            note="stop after a hang of this attempt: already recorded and requeued",
        )
    if facts.failure_claimed and trigger not in ("failure", "hang"):
        return Decision(
            kind="",
            event=None,
            action="none",
            exit_code=1,
            note="stop after a failure of this attempt: already recorded by the failing rank",
        )
    if _step_ending(trigger, facts):
        return Decision(
            kind="",
            event=None,
            action="none",
            exit_code=1,
            save=False,
            note="TERM while the job runs on: the step is ending (a rank died); the batch "
            "script decides what follows",
        )
    if facts.nodes_lost:
        nodes = tuple(sorted(facts.nodes_lost))
        if facts.requeued_by is None:
            # a failure on a node that is down already, before Slurm requeued the job: not the
            # training's failure (no budget spent), and no restart in place on a lost node
            return Decision(
                kind="node_fail",
                event="node_fail",
                action="requeue",
                exit_code=0,
                exclude=nodes,
                exclude_reason="node failure",
                save=False,
                note=f"{','.join(nodes)} went down under the job: requeued off it",
            )
        return Decision(
            kind="node_fail",
            event="node_fail",
            action="none",
            exit_code=0,
            requeued_by="slurm",
            exclude=nodes,
            exclude_reason="node failure",
            save=False,
            note=f"Slurm failed {','.join(nodes)} under the job and requeued it",
        )
    kind = _kind(trigger, facts)
    event = EVENT_OF_KIND[kind]
    failed = kind == "failure"
    if kind == "cancel":
        return Decision(kind, event, "none", 0, save=False, note="cancelled: not requeuing")
    after = {**counts, event: int(counts.get(event, 0)) + 1}
    if failed:
        key = f"failure_{facts.failure_class}"
        after[key] = int(counts.get(key, 0)) + 1
    exhausted = over_budget(after, budgets)
    if exhausted is not None:
        if failed and facts.failure_class == "user":
            limit = budgets.max_user_failures
            exhausted = (
                f"not retried: {facts.failure_why or 'an error of the code or config'}, which a "
                f"retry would hit again (requeue.max_user_failures={limit})"
            )
        return Decision(kind, event, "none", BUDGET_EXHAUSTED_EXIT_CODE, exhausted=exhausted)
    stalled = _no_progress(kind, facts, counts, budgets)
    if stalled is not None:
        return Decision(kind, event, "none", BUDGET_EXHAUSTED_EXIT_CODE, exhausted=stalled)
    exclude: tuple[str, ...] = ()
    why = ""
    if kind == "hang":
        exclude, why = facts.suspects, "hang"
    elif failed and facts.device_fault and facts.node:
        exclude, why = (facts.node,), "device fault"
    in_place_left = int(counts.get("restart_in_place", 0)) < budgets.max_restarts_in_place
    if (
        kind in ("failure", "hang")
        and facts.executor == "slurm"
        and facts.in_place
        and facts.requeued_by is None
        and not exclude
        and in_place_left
    ):
        # the allocation is still ours: a new step on the same nodes, from the last checkpoint
        return Decision(kind, event, "restart_in_place", 1 if failed else 0)
    chain = budgets.mode == "chain"
    if kind == "preemption" and not chain and _slurm_requeues(facts):
        # (a chain's link is not requeueable: Slurm ends it, the next link resumes the run)
        return Decision(
            kind, event, "none", 0, requeued_by="slurm",
            note="preempted on a release that requeues preempted jobs itself: left to Slurm",
        )  # fmt: skip
    if facts.requeued_by is not None:
        return Decision(
            kind, event, "none", 1 if failed else 0, requeued_by=facts.requeued_by,
            exclude=exclude, exclude_reason=why,
        )  # fmt: skip
    if facts.executor == "slurm" and chain:
        # a link of a chain (jobs.chain): no scontrol requeue; the link exits 75 and the next
        # link, queued behind it (afternotok), resumes the run from its last checkpoint
        return Decision(kind, event, "exit_requeue", REQUEUE_EXIT_CODE, note=CHAIN_NOTE)
    if facts.executor == "slurm":
        return Decision(
            kind, event, "requeue", 1 if failed else 0, exclude=exclude, exclude_reason=why
        )
    if failed:
        # outside Slurm a failed process is restarted by its launcher (the local executor,
        # torchrun's --max-restarts) or not at all: recorded, exit 1
        return Decision(kind, event, "none", 1)
    return Decision(kind, event, "exit_requeue", REQUEUE_EXIT_CODE)
