"""The one stop decision (train.stop.decision.decide), as a table: every trigger, on Slurm and
locally, within and over its budget, and what the facts change (issue 24)."""

from __future__ import annotations

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
