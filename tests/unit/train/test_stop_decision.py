"""The one stop decision (train.stop.decision.decide), as a table: every trigger, on Slurm and
locally, within and over its budget, and what the facts change (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from train.env import DistEnv
from train.history import RunHistory
from train.spec.config import RequeueConfig
from train.stop import (
    BUDGET_EXHAUSTED_EXIT_CODE,
    REQUEUE_EXIT_CODE,
    Decider,
    Decision,
    StopFacts,
    decide,
    stop_attempt,
)

SLURM = StopFacts("slurm")
LOCAL = StopFacts("local")
PLAIN = StopFacts("none")
BUDGETS = RequeueConfig(max_preemptions=2, max_timeouts=2, max_failures=2, max_hangs=1)
NONE: dict[str, int] = {}
PREEMPTED = {"PreemptTime": "2026-11-27T20:00:00", "JobState": "RUNNING"}
SPENT = {"preempted": 2, "timeout": 2, "failure": 2, "failure_unknown": 2, "hang": 1}


def _facts(base: StopFacts, **changes: Any) -> StopFacts:
    from dataclasses import replace

    return replace(base, **changes)


# (id, trigger, facts, counts) -> (event, action, exit code, budget spent?, excluded nodes)
CASES = [
    # a stop signal (the job's requeue signal, or TERM): Slurm says why
    ("slurm-preemption", "signal", _facts(SLURM, slurm_kind="preemption"), NONE,
     ("preempted", "requeue", 0, False, ())),
    ("slurm-time-limit", "signal", _facts(SLURM, slurm_kind="timeout"), NONE,
     ("timeout", "requeue", 0, False, ())),
    ("slurm-cancel", "signal", _facts(SLURM, slurm_kind="cancel"), NONE,
     ("cancelled", "none", 0, False, ())),
    ("slurm-unexplained-signal", "signal", SLURM, NONE,
     ("preempted", "requeue", 0, False, ())),
    ("slurm-term-checked-as-cancel", "cancel", _facts(SLURM, slurm_kind="cancel"), NONE,
     ("cancelled", "none", 0, False, ())),
    ("slurm-term-was-a-preemption", "cancel", _facts(SLURM, slurm_kind="preemption"), NONE,
     ("preempted", "requeue", 0, False, ())),
    ("known-preemption", "preemption", SLURM, NONE, ("preempted", "requeue", 0, False, ())),
    ("known-time-limit", "timeout", SLURM, NONE, ("timeout", "requeue", 0, False, ())),
    # a node failure wins over the signal's kind: Slurm requeued, no budget, nodes kept out
    ("node-failure", "signal",
     _facts(SLURM, slurm_kind="preemption", nodes_lost={"n2": "DOWN"}, requeued_by="slurm"),
     SPENT, ("node_fail", "none", 0, False, ("n2",))),
    ("node-failure-after-a-failure", "failure",
     _facts(SLURM, nodes_lost={"n1": "DOWN*"}, requeued_by="slurm"), NONE,
     ("node_fail", "none", 0, False, ("n1",))),
    # a failure while a node of ours is down and Slurm has not requeued yet: the node's death,
    # requeued off it by us, never restarted in place on it, no failure budget spent
    ("node-down-before-slurm-requeued", "failure",
     _facts(SLURM, in_place=True, nodes_lost={"n1": "DOWN"}), SPENT,
     ("node_fail", "requeue", 0, False, ("n1",))),
    # failures and hangs
    ("slurm-failure", "failure", SLURM, NONE, ("failure", "requeue", 1, False, ())),
    ("slurm-device-fault", "failure", _facts(SLURM, device_fault=True, node="n3"), NONE,
     ("failure", "requeue", 1, False, ("n3",))),
    ("slurm-hang", "hang", _facts(SLURM, suspects=("n2",)), NONE,
     ("hang", "requeue", 0, False, ("n2",))),
    # over budget: recorded, never requeued, exit 3
    ("preemption-over-budget", "signal", _facts(SLURM, slurm_kind="preemption"), SPENT,
     ("preempted", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("time-limit-over-budget", "timeout", SLURM, SPENT,
     ("timeout", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("failure-over-budget", "failure", SLURM, SPENT,
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("hang-over-budget", "hang", _facts(SLURM, suspects=("n2",)), SPENT,
     ("hang", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("local-over-budget", "signal", LOCAL, SPENT,
     ("preempted", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    # already requeued by the user's framework (Lightning) or Slurm: recorded, not again
    ("requeued-by-the-command", "signal",
     _facts(SLURM, slurm_kind="preemption", requeued_by="command"), NONE,
     ("preempted", "none", 0, False, ())),
    # a hang already claimed this attempt: nothing more to record
    ("after-a-hang", "signal", _facts(SLURM, hang_claimed=True), NONE,
     (None, "none", 0, False, ())),
    ("failure-after-a-hang", "failure", _facts(SLURM, hang_claimed=True), NONE,
     (None, "none", 1, False, ())),
    # the local executor: a requeue request (any signal, TERM included) vs its cancel
    ("local-requeue-request", "signal", LOCAL, NONE,
     ("preempted", "exit_requeue", REQUEUE_EXIT_CODE, False, ())),
    ("local-cancel", "signal", _facts(LOCAL, local_cancel=True), NONE,
     ("cancelled", "none", 0, False, ())),
    ("local-failure", "failure", LOCAL, NONE, ("failure", "none", 1, False, ())),
    ("local-hang", "hang", LOCAL, NONE, ("hang", "exit_requeue", REQUEUE_EXIT_CODE, False, ())),
    # a plain process (no Slurm, no launcher of ours): exit 75 for whoever restarts it
    ("plain-signal", "signal", PLAIN, NONE,
     ("preempted", "exit_requeue", REQUEUE_EXIT_CODE, False, ())),
    ("plain-failure", "failure", PLAIN, NONE, ("failure", "none", 1, False, ())),
    # issue 26: a batch script that restarts failed steps in place (SLURM_TRAIN_IN_PLACE)
    ("failure-in-place", "failure", _facts(SLURM, in_place=True), NONE,
     ("failure", "restart_in_place", 1, False, ())),
    ("hang-in-place", "hang", _facts(SLURM, in_place=True), NONE,
     ("hang", "restart_in_place", 0, False, ())),
    ("hang-in-place-with-a-suspect", "hang", _facts(SLURM, in_place=True, suspects=("n2",)), NONE,
     ("hang", "requeue", 0, False, ("n2",))),
    # issue 44.5: a hang that names no node restarts in place while the budget lasts (the
    # watcher decides with the same in-place facts as a rank), then goes through the queue
    ("hang-in-place-budget-spent", "hang", _facts(SLURM, in_place=True),
     {"restart_in_place": 3}, ("hang", "requeue", 0, False, ())),
    ("hang-without-an-in-place-batch-script", "hang", SLURM, NONE,
     ("hang", "requeue", 0, False, ())),
    ("device-fault-in-place", "failure",
     _facts(SLURM, in_place=True, device_fault=True, node="n1"), NONE,
     ("failure", "requeue", 1, False, ("n1",))),
    ("in-place-budget-spent", "failure", _facts(SLURM, in_place=True), {"restart_in_place": 3},
     ("failure", "requeue", 1, False, ())),
    ("local-failure-is-not-in-place", "failure", _facts(LOCAL, in_place=True), NONE,
     ("failure", "none", 1, False, ())),
    # failures sorted by cause: each class spends its own budget
    ("user-error", "failure", _facts(SLURM, in_place=True, failure_class="user"), NONE,
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("infra-failure-after-unknown-ones", "failure", _facts(SLURM, failure_class="infra"),
     {"failure": 2, "failure_unknown": 2}, ("failure", "requeue", 1, False, ())),
    ("infra-failure-over-its-budget", "failure", _facts(SLURM, failure_class="infra"),
     {"failure": 10, "failure_infra": 10},
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    # a TERM while the job runs on, not preempted: srun ends the step (a rank died)
    ("term-ends-the-step", "signal",
     _facts(SLURM, in_place=True, signal="SIGTERM", slurm_kind="preemption"), NONE,
     (None, "none", 1, False, ())),
    ("term-of-a-real-preemption", "signal",
     _facts(SLURM, in_place=True, signal="SIGTERM", slurm_kind="preemption",
            preempt_evidence=True), NONE, ("preempted", "requeue", 0, False, ())),
    ("requeue-signal-in-place", "signal",
     _facts(SLURM, in_place=True, signal="SIGUSR2", slurm_kind="preemption"), NONE,
     ("preempted", "requeue", 0, False, ())),
    # a command's supervisor: no rank's command reported a failure (an operator's TERM)
    ("term-no-command-failed", "signal",
     _facts(SLURM, in_place=True, signal="SIGTERM", slurm_kind="preemption",
            no_rank_failed=True), NONE, ("preempted", "requeue", 0, False, ())),
    ("term-without-in-place", "signal", _facts(SLURM, signal="SIGTERM", slurm_kind="preemption"),
     NONE, ("preempted", "requeue", 0, False, ())),
    ("stop-after-a-claimed-failure", "signal", _facts(SLURM, failure_claimed=True), NONE,
     (None, "none", 1, False, ())),
    # scontrol requeue from outside (an administrator): Slurm requeued it already
    ("requeued-from-outside", "signal",
     _facts(SLURM, slurm_kind="requeued", requeued_by="slurm", preempt_evidence=True), NONE,
     ("preempted", "none", 0, False, ())),
    ("preempted-and-requeued-by-slurm", "signal",
     _facts(SLURM, slurm_kind="preemption", requeued_by="slurm", preempt_evidence=True,
            in_place=True, signal="SIGTERM"), NONE,
     ("preempted", "none", 0, False, ())),
    # a preemption (PreemptTime) per release behaviour (README's table): 22.05 ends a job that
    # exits in its grace time COMPLETED (we requeue); 24.11 and 26.05 requeue it themselves
    # (ours would be a second requeue: 24.11.5 then ends the next run too)
    ("preempted-on-a-release-that-does-not-requeue-it", "signal",
     _facts(SLURM, slurm_kind="preemption", job_info=PREEMPTED, preempt_evidence=True), NONE,
     ("preempted", "requeue", 0, False, ())),
    ("preempted-on-a-release-that-requeues-it-itself", "signal",
     _facts(SLURM, slurm_kind="preemption", job_info=PREEMPTED, preempt_evidence=True,
            slurm_requeues_preempted=True), NONE,
     ("preempted", "none", 0, False, ())),
    ("usr2-without-preemption-on-a-self-requeueing-release", "signal",
     _facts(SLURM, slurm_kind="preemption", job_info={"PreemptTime": "None"},
            slurm_requeues_preempted=True), NONE,
     ("preempted", "requeue", 0, False, ())),
    ("preempted-over-budget-on-a-self-requeueing-release", "signal",
     _facts(SLURM, slurm_kind="preemption", job_info=PREEMPTED, preempt_evidence=True,
            slurm_requeues_preempted=True), SPENT,
     ("preempted", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
]  # fmt: skip


@pytest.mark.parametrize(
    ("trigger", "facts", "counts", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_the_decision_table(
    trigger: Any, facts: StopFacts, counts: dict[str, int], expected: tuple[Any, ...]
) -> None:
    d = decide(trigger, facts, counts, BUDGETS)
    event, action, code, spent, exclude = expected
    assert (d.event, d.action, d.exit_code, d.exhausted is not None, d.exclude) == (
        event, action, code, spent, exclude,
    )  # fmt: skip


def test_a_chains_link_is_never_left_to_slurms_requeue() -> None:
    """A link of a chain is not requeueable: on 24.11+ too its preemption goes to the next link."""
    facts = _facts(
        SLURM, slurm_kind="preemption", job_info=PREEMPTED, slurm_requeues_preempted=True
    )
    d = decide("signal", facts, NONE, RequeueConfig(mode="chain"))
    assert (d.action, d.requeued_by) == ("exit_requeue", None)


def test_a_preemption_left_to_slurm_is_recorded_as_its_requeue() -> None:
    facts = _facts(
        SLURM, slurm_kind="preemption", job_info=PREEMPTED, slurm_requeues_preempted=True
    )
    d = decide("signal", facts, NONE, BUDGETS)
    assert (d.requeued_by, d.requeues) == ("slurm", True)


@pytest.mark.parametrize(
    ("release", "itself"),
    [("22.05.8", False), ("23.02.7", False), ("24.11.5", True), ("26.05.5", True),
     ("", False), (None, False), ("garbage", False), ("24", False)],
)  # fmt: skip
def test_which_releases_requeue_a_preempted_job_themselves(release: Any, itself: bool) -> None:
    from train.stop.facts import requeues_preempted

    assert requeues_preempted(release) is itself


def test_requeued_by_others_is_carried_and_counts_as_going_on() -> None:
    d = decide("signal", _facts(SLURM, requeued_by="command"), NONE, BUDGETS)
    assert d.requeued_by == "command" and d.requeues


def test_only_a_cancel_or_a_lost_node_withholds_the_save_signal() -> None:
    """A command gets its save signal at every stop but a cancel and a node failure, over
    budget included (its work since the last periodic save is never thrown away)."""
    saves = {
        case[0]: decide(case[1], case[2], case[3], BUDGETS).save
        for case in CASES
        if case[1] in ("signal", "cancel")
    }
    withheld = {k for k, v in saves.items() if not v}
    assert withheld == {
        "slurm-cancel",
        "slurm-term-checked-as-cancel",
        "node-failure",
        "local-cancel",
        "term-ends-the-step",
    }


def test_a_user_error_says_why_it_is_not_retried() -> None:
    facts = _facts(SLURM, failure_class="user", failure_why="an error in the code")
    d = decide("failure", facts, NONE, BUDGETS)
    assert d.exhausted is not None and d.exhausted.startswith("not retried: an error in the code")
    assert "requeue.max_user_failures=0" in d.exhausted


def test_the_budget_text_names_the_field_to_raise() -> None:
    d: Decision = decide("hang", SLURM, SPENT, BUDGETS)
    assert d.exhausted is not None and "requeue.max_hangs=1" in d.exhausted


CHAIN = RequeueConfig(max_preemptions=2, max_timeouts=2, max_failures=2, mode="chain")


@pytest.mark.parametrize(
    ("trigger", "facts", "counts", "expected"),
    [
        pytest.param("signal", _facts(SLURM, slurm_kind="preemption"), NONE,
                     ("preempted", "exit_requeue", REQUEUE_EXIT_CODE, False), id="preemption"),
        pytest.param("signal", _facts(SLURM, slurm_kind="timeout"), NONE,
                     ("timeout", "exit_requeue", REQUEUE_EXIT_CODE, False), id="time-limit"),
        pytest.param("failure", SLURM, NONE,
                     ("failure", "exit_requeue", REQUEUE_EXIT_CODE, False), id="failure"),
        pytest.param("failure", _facts(SLURM, in_place=True), NONE,
                     ("failure", "restart_in_place", 1, False), id="failure-in-place-first"),
        pytest.param("signal", _facts(SLURM, slurm_kind="cancel"), NONE,
                     ("cancelled", "none", 0, False), id="cancel-ends-it"),
        pytest.param("signal", _facts(SLURM, slurm_kind="preemption"), SPENT,
                     ("preempted", "none", BUDGET_EXHAUSTED_EXIT_CODE, True), id="over-budget"),
    ],
)  # fmt: skip
def test_a_link_of_a_chain_exits_for_the_next_link_instead_of_requeueing(
    trigger: Any, facts: StopFacts, counts: dict[str, int], expected: tuple[Any, ...]
) -> None:
    """requeue.mode chain (jobs.chain): where the decision would requeue the Slurm job, the
    link exits 75 and the next link of the chain resumes the run; budgets count the same."""
    d = decide(trigger, facts, counts, CHAIN)
    assert (d.event, d.action, d.exit_code, d.exhausted is not None) == expected


def test_a_link_of_a_chain_records_its_requeue_and_exits_75(tmp_path: Any) -> None:
    """The link exits 75 (the batch script ends with it, the job is not COMPLETED, the next
    link's afternotok is met) and records a requeue via the chain, never scontrol requeue."""
    from train.history import RunHistory
    from train.stop.act import carry_out

    class NoSlurm:
        def requeue(self, job_id: str) -> None:
            raise AssertionError("a chain never requeues its job")

    d = decide("signal", _facts(SLURM, slurm_kind="preemption"), NONE, CHAIN)
    history = RunHistory(tmp_path)
    base = {"step": 7, "restart_count": 0, "job_id": "42"}
    assert carry_out(d, history, base, tmp_path, client=NoSlurm()) == REQUEUE_EXIT_CODE
    assert [(e["event"], e.get("via")) for e in history.events()] == [("requeue", "chain")]


# -- issue 44: budgets kept over their scope (train.history.budget_counts), no progress, TERM ----
def _ev(event: str, job: str | None = "7", restart: int = 0, **fields: Any) -> dict[str, Any]:
    if event == "failure":  # infrastructure failures (budget 10) unless a row says otherwise
        fields.setdefault("failure_class", "infra")
    return {"event": event, "job_id": job, "restart_count": restart, **fields}


_THREE_IN_PLACE = [_ev("failure"), _ev("restart_in_place"), _ev("failure", in_place=1),
                   _ev("restart_in_place", in_place=1), _ev("failure", in_place=2),
                   _ev("restart_in_place", in_place=2)]  # fmt: skip
_SPENT_FAILURES = [_ev("failure", failure_class="unknown"), _ev("requeue"),
                   _ev("failure", restart=1, failure_class="unknown"),
                   _ev("requeue", restart=1)]  # fmt: skip
_STALLED = [_ev("start", step=0), _ev("failure", step=47)] + [
    e for r in (1, 2, 3)
    for e in (_ev("resume", restart=r, step=40), _ev("failure", restart=r, step=45))
]  # fmt: skip
IN_PLACE = _facts(SLURM, in_place=True, failure_class="infra")

# (id, trigger, facts, events so far, this attempt's job and restart count) -> as CASES
SCOPED = [
    # item 6: max_restarts_in_place is per allocation: a later start from the queue has its own
    ("in-place-budget-spent-in-this-allocation", "failure", IN_PLACE, _THREE_IN_PLACE, ("7", 0),
     ("failure", "requeue", 1, False, ())),
    ("in-place-budget-of-an-earlier-allocation", "failure", IN_PLACE,
     [*_THREE_IN_PLACE, _ev("requeue")], ("7", 1),
     ("failure", "restart_in_place", 1, False, ())),
    # item 6: the stop budgets are per submission: a new one resuming the directory starts afresh
    ("failures-spent-in-this-submission", "failure", SLURM, _SPENT_FAILURES, ("7", 2),
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("failures-spent-by-an-earlier-submission", "failure", SLURM, _SPENT_FAILURES, ("8", 0),
     ("failure", "requeue", 1, False, ())),
    ("local-new-submission-starts-afresh", "failure", LOCAL,
     [_ev("failure", None, r, failure_class="unknown") for r in (0, 1, 2)]
     + [_ev("start", None, 0)], (None, 0),
     ("failure", "none", 1, False, ())),
    # round 2 item 5: local events carry their submission (local-N): an earlier submission's
    # failures at restart 0 (each cancelled then) are not this one's, though no count fell
    ("local-submission-by-its-id", "failure", LOCAL,
     [e for s in ("local-1", "local-2")
      for e in (_ev("failure", None, 0, failure_class="unknown", submission=s),
                _ev("cancelled", None, 0, submission=s))]
     + [_ev("start", None, 0, submission="local-3")], (None, 0, "local-3"),
     ("failure", "none", 1, False, ())),
    ("local-failures-spent-in-this-submission", "failure", LOCAL,
     [_ev("failure", None, r, failure_class="unknown") for r in (0, 1)], (None, 2),
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    # item 6: three restarts resumed from step 40 and none saved a newer checkpoint: stop
    ("no-checkpoint-progress", "failure", _facts(IN_PLACE, checkpoint_step=40), _STALLED, ("7", 3),
     ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("no-checkpoint-progress-hang", "hang", _facts(SLURM, checkpoint_step=40), _STALLED, ("7", 3),
     ("hang", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("a-newer-checkpoint-is-progress", "failure", _facts(IN_PLACE, checkpoint_step=50), _STALLED,
     ("7", 3), ("failure", "restart_in_place", 1, False, ())),
    ("two-stalled-restarts-are-within-budget", "failure", _facts(IN_PLACE, checkpoint_step=40),
     _STALLED[:-2], ("7", 2), ("failure", "restart_in_place", 1, False, ())),
    ("a-preemption-saves-its-own-progress", "signal",
     _facts(SLURM, slurm_kind="preemption", checkpoint_step=40), _STALLED, ("7", 3),
     ("preempted", "requeue", 0, False, ())),
    # round 2 item 6: a command with no checkpoint of ours: its train.report step is its
    # progress (the restarts' start events carry it; the facts' checkpoint_step is it now)
    ("command-no-reported-progress", "failure", _facts(IN_PLACE, checkpoint_step=40),
     [_ev("start"), _ev("failure")] + [
         e for r in (1, 2, 3)
         for e in (_ev("start", restart=r, reported_step=40), _ev("failure", restart=r))],
     ("7", 3), ("failure", "none", BUDGET_EXHAUSTED_EXIT_CODE, True, ())),
    ("command-reported-progress", "failure", _facts(IN_PLACE, checkpoint_step=55),
     [_ev("start"), _ev("failure")] + [
         e for r in (1, 2, 3)
         for e in (_ev("start", restart=r, reported_step=40), _ev("failure", restart=r))],
     ("7", 3), ("failure", "restart_in_place", 1, False, ())),
    # item 7: a TERM decided after every rank saved and met (an operator's scancel
    # --signal=TERM): a stop like the requeue signal, never "the step is ending"
    ("term-after-the-ranks-met", "signal",
     _facts(SLURM, in_place=True, signal="SIGTERM", slurm_kind="preemption", peers_met=True), [],
     ("7", 0), ("preempted", "requeue", 0, False, ())),
]  # fmt: skip


@pytest.mark.parametrize(
    ("trigger", "facts", "events", "attempt", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in SCOPED],
)
def test_the_decision_table_with_budgets_over_their_scope(
    trigger: Any,
    facts: StopFacts,
    events: list[dict[str, Any]],
    attempt: tuple[Any, ...],
    expected: tuple[Any, ...],
) -> None:
    from train.history import budget_counts

    submission = attempt[2] if len(attempt) > 2 else None
    counts = budget_counts(
        events, job_id=attempt[0], restart_count=attempt[1], submission=submission
    )
    d = decide(trigger, facts, counts, BUDGETS)
    event, action, code, spent, exclude = expected
    assert (d.event, d.action, d.exit_code, d.exhausted is not None, d.exclude) == (
        event, action, code, spent, exclude,
    )  # fmt: skip


def test_no_progress_says_so() -> None:
    from train.history import budget_counts

    counts = budget_counts(_STALLED, job_id="7", restart_count=3)
    d = decide("failure", _facts(IN_PLACE, checkpoint_step=40), counts, BUDGETS)
    assert d.exhausted is not None and d.exhausted.startswith("no checkpoint progress: 3 ")
    assert "from step 40" in d.exhausted and "max_restarts_without_progress=3" in d.exhausted


def test_every_budget_has_a_stated_scope_in_the_spec() -> None:
    """Item 6: each budget's scope is written in its field's description, the same as the
    table the counts are kept by (train.history.BUDGET_SCOPES)."""
    from train.history import BUDGET_SCOPES, BUDGETS

    fields = RequeueConfig.model_fields
    assert set(BUDGETS.values()) <= set(BUDGET_SCOPES)
    for name, scope in BUDGET_SCOPES.items():
        assert f"per {scope}" in str(fields[name].description), name


# -- issue 44: the rest of a stop's path, one row each (the batch script after the step, the
# carrying out, the warning time); each row returns what the path did ---------------------------
def _completed_then_a_rank_fails(tmp: Any) -> Any:
    """Item 2: rank 0 recorded complete, rank 1 aborts at exit (134): the script ends 0."""
    from train.history import RunHistory
    from train.stop.step import after_step

    RunHistory(tmp).append("complete", step=9, restart_count=0, job_id="7")
    return after_step(tmp, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=134)


class _Refusing:
    def __init__(self, refusals: int) -> None:
        self.refusals, self.asked = refusals, 0

    def requeue(self, job_id: str) -> None:
        self.asked += 1
        if self.asked <= self.refusals:
            raise RuntimeError("Unable to contact slurm controller")

    def show_job(self, job_id: str) -> dict[str, str]:
        return {"JobState": "RUNNING", "Restarts": "0"}


def _refused_then_retried(tmp: Any) -> Any:
    """Item 10: the ranks' requeue refused (exit 75, requeue_failed), the batch script's retry
    taken: recorded as done by the batch script, the script ends 0."""
    from train.history import RunHistory
    from train.stop.act import carry_out
    from train.stop.step import after_step

    history = RunHistory(tmp)
    base = {"step": 3, "restart_count": 0, "job_id": "7"}
    d = decide("preemption", SLURM, NONE, BUDGETS)
    code = carry_out(d, history, base, tmp, client=_Refusing(1))
    client = _Refusing(0)
    after = after_step(tmp, BUDGETS, job_id="7", restart_count=0, in_place=0, exit_code=code,
                       client=client)  # fmt: skip
    return code, after, [(e["event"], e.get("via") or e.get("by")) for e in history.events()]


def _one_slow_stop(tmp: Any) -> Any:
    """Item 9: one stop whose signal landed at the start of an evaluation (100 s), then fast
    ones, in 120 s attempts warned 30 s ahead: no attempt stops itself more than a quarter of its
    time early, and the fast stops bring the lead back."""
    from train.stop.lead import early_stop_lead_s, needed_lead_s

    events: list[dict[str, Any]] = []
    leads = []
    for since in (100.0, 3.0, 3.0, 3.0):
        events.append({"event": "checkpoint", "since_signal_s": since})
        leads.append(early_stop_lead_s(needed_lead_s(events), 30, 120))
    return leads, needed_lead_s(events)


def _restart_in_place_tells_the_command(tmp: Any) -> Any:
    """Suspected in issue 44: after a restart in place (SLURM_RESTART_COUNT unchanged) a command
    that resumes when TRAIN_RESTART_COUNT > 0 must see it > 0."""
    from train.command.processes import child_environ
    from train.env import DistEnv

    return [
        child_environ({}, DistEnv(job_id="7", restart_count=r, in_place=n), tmp, None, "auto")[
            "TRAIN_RESTART_COUNT"
        ]
        for r, n in ((0, 0), (0, 1), (1, 0), (1, 2))
    ]


class _Preempting:
    """Slurm preempting job 7 (PreemptTime set): what it is asked, what it is told."""

    def __init__(self, installed: str | None = None) -> None:
        self.asked, self.requeued = 0, 0
        self.installed = installed

    def installed_release(self) -> str | None:
        """``scontrol --version``: asked only where the batch script exported no release."""
        assert self.installed is not None, "the release was asked though the script exported it"
        return self.installed

    def show_job(self, job_id: str) -> dict[str, str]:
        self.asked += 1
        return {**PREEMPTED, "Restarts": "0", "EndTime": "2099-01-01T00:00:00"}

    def requeue(self, job_id: str) -> None:
        self.requeued += 1


def _preempted_on(release: str, exported: bool = True) -> Any:
    """Rank 0's stop of a preempted attempt, the release exported by the batch script: on 22.05
    it asks for the requeue; on 24.11 and 26.05 it leaves it to Slurm, recorded as Slurm's. One
    scontrol show job, no query for the release. A batch script written by hand exports none:
    the release is the job's own ``scontrol --version`` (else 24.11 runs the job twice more:
    Slurm's requeue and ours)."""
    from train.env import SLURM_RELEASE_ENV

    environ = (
        {"SLURM_JOB_ID": "7", SLURM_RELEASE_ENV: release} if exported else {"SLURM_JOB_ID": "7"}
    )

    def run(tmp: Any) -> Any:
        client = _Preempting(None if exported else release)
        env = DistEnv.from_env(environ)  # the stopper's environment says what was exported
        code, _ = stop_attempt(env, tmp, RequeueConfig(), None, client=client)  # type: ignore[arg-type]
        events = [(e["event"], e.get("via")) for e in RunHistory(tmp).events()]
        return code, client.asked, client.requeued, events

    return run


PATH_CASES = [
    ("preempted-on-22.05", _preempted_on("22.05.8"),
     (0, 1, 1, [("preempted", None), ("requeue", "scontrol")])),
    ("preempted-on-24.11", _preempted_on("24.11.5"),
     (0, 1, 0, [("preempted", None), ("requeue", "slurm")])),
    ("preempted-on-26.05", _preempted_on("26.05.5"),
     (0, 1, 0, [("preempted", None), ("requeue", "slurm")])),
    ("preempted-on-24.11-by-hand", _preempted_on("24.11.5", exported=False),
     (0, 1, 0, [("preempted", None), ("requeue", "slurm")])),
    ("preempted-on-22.05-by-hand", _preempted_on("22.05.8", exported=False),
     (0, 1, 1, [("preempted", None), ("requeue", "scontrol")])),
    ("restart-in-place-tells-the-command", _restart_in_place_tells_the_command,
     ["0", "1", "1", "3"]),
    ("completed-then-a-rank-fails", _completed_then_a_rank_fails, 0),
    ("requeue-refused-then-retried", _refused_then_retried,
     (REQUEUE_EXIT_CODE, 0, [("requeue_failed", "rank"), ("requeue", "batch_script")])),
    ("one-slow-stop-does-not-lock-the-run", _one_slow_stop, ([None, None, None, None], 13.0)),
]  # fmt: skip


@pytest.mark.parametrize(("path", "expected"), [pytest.param(*c[1:], id=c[0]) for c in PATH_CASES])
def test_the_stop_path_table(tmp_path: Any, path: Any, expected: Any) -> None:
    assert path(tmp_path) == expected


def test_a_decider_and_a_rank_reach_the_same_decision(tmp_path: Path) -> None:
    """Issue 41/44.5: every stopper implements the one complete StopEnv. The hang watcher and
    the batch script's after-step (a Decider: not a rank) give the stop path the same in-place
    facts as rank 0 (a DistEnv) of the same attempt, and get the same decision (a hang: the
    stop path asks Slurm nothing)."""
    environ = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1", "SLURM_TRAIN_IN_PLACE": "1"}
    rank = DistEnv.from_env(environ)
    decider = Decider("4242", 1, 1, in_place_supervised=True)
    assert decider.attempt == rank.attempt == "1.1"
    decisions = []
    for env in (rank, decider):
        run = tmp_path / type(env).__name__
        run.mkdir()
        code, decision = stop_attempt(env, run, RequeueConfig(), "hang")
        assert decision is not None
        decisions.append((code, decision.event, decision.action))
        (event,) = [e for e in RunHistory(run).events() if e["event"] == "hang"]
        assert (event["restart_count"], event["in_place"]) == (1, 1)
    assert decisions[0] == decisions[1]
    assert decisions[0][2] == "restart_in_place"


def test_a_commands_progress_is_its_last_reported_step(tmp_path: Path) -> None:
    """Round 2 item 6: a command that keeps no checkpoint of ours but reports its steps
    (train.report: metrics.jsonl lines of kind report): the stop's progress is its last
    reported step; a checkpoint of ours wins where there is one."""
    from train.stop.facts import gather

    def progress() -> int | None:
        facts = gather("failure", job_id=None, restart_count=1, run_dir=tmp_path,
                       signal_delay_s=60)  # fmt: skip
        return facts.checkpoint_step

    assert progress() is None
    lines = [{"kind": "report", "time": 1.0, "step": s, "scalars": {}} for s in (10, 20)]
    lines.append({"kind": "report", "time": 2.0, "step": "30"})  # foreign: skipped
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "rep'  # torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    assert progress() == 20
    (tmp_path / "checkpoints" / "step-5").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-5" / "manifest.json").write_text("{}")
    assert progress() == 5


def test_every_budget_of_the_table_is_a_field_of_the_requeue_config() -> None:
    """Issue 41: the budget check reads ``RequeueConfig.budgets()`` by the names the owner's
    table gives (``train.runfiles.BUDGETS``), no ``getattr`` with a default: they agree."""
    from train.runfiles import BUDGETS

    budgets = RequeueConfig().budgets()
    assert set(BUDGETS.values()) == set(budgets)
    assert set(budgets) <= set(RequeueConfig.model_fields)
