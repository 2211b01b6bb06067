"""The stop path: what happens at a preemption, a time limit, a cancel, a node failure, a failure
or a hang, decided in ONE place (torch-free).

The protocol, for every way a run is interrupted::

    trigger                        who notices                     who decides (one per attempt)
    -----------------------------  ------------------------------  -----------------------------
    Slurm's signal (requeue.signal  every rank's guard (signals);   rank 0 of the session, or
      or TERM): preemption, time    the ranks agree at a step        rank 0's command supervisor
      limit, cancel, node failure   boundary and save first
    a failure (exception, command  the failing rank / supervisor   the first failing rank
      exit != 0)                                                     (claim: .failures/JOB-N)
    a hang                         every rank's watcher             the first watcher
                                                                     (claim: hangs/ATTEMPT/claimed)
    a rank died unrecorded         the local launcher               the local launcher

    0. echo?    train.stop.act.ended_elsewhere  the attempt's end already recorded by another
                                            process (a hang claim, a failure claim): a stop
                                            after it records and saves nothing
    1. facts    train.stop.facts.gather     ONE `scontrol show job` per stop (why Slurm stops
                                            the job, nodes it failed; a failure also asks
                                            `scontrol show node`), the local launcher's
                                            cancel file, the hang claim, a device fault's text
    2. decide   train.stop.decision.decide  pure: (trigger, facts, event counts, budgets) ->
                                            Decision (event, budget spent?, requeue / exit 75 /
                                            none, exit code, nodes to exclude, save or not)
    3. record   train.stop.act.record       the event, then budget_exhausted (events.jsonl)
       (a command: its save signal, its exit within the grace, the other ranks' exits)
    4. act      train.stop.act.carry_out    `scontrol requeue` (or exit 75 when it fails or
                                            there is no Slurm), the `requeue` event, ExcNodeList
                                            (train.stop.quarantine)

Exit codes: 0 (requeued or stopped on purpose; other ranks always 0), 1 (a failure, requeued or
not), 75 (:data:`REQUEUE_EXIT_CODE`: restart me; the requeue template and the local executor
requeue on it), 3 (:data:`BUDGET_EXHAUSTED_EXIT_CODE`: a budget is spent, never restart).

Modules: :mod:`train.stop.signals` (the early-signal store and the preemption guard: handlers
only set a flag), :mod:`train.stop.facts`, :mod:`train.stop.decision`, :mod:`train.stop.act`,
:mod:`train.stop.quarantine` (which node an interruption is due to; ExcNodeList),
:mod:`train.stop.claims` (the hang claim the watcher makes and every stopper reads),
:mod:`train.stop.stopenv` (:class:`StopEnv`, what every stopper is; :class:`Decider`, a
process that decides without being a rank). Callers: the
run session (:mod:`train.session`, the built-in trainer and ``entrypoint.function``), the command
supervisor (:mod:`train.command.stop`), the hang watcher (:mod:`train.hang.watcher`) and the
local executor (:mod:`jobs.localrun`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.stop.act import (
        attempt_fields,
        carry_out,
        describe_failure,
        ended_elsewhere,
        failure_claimed,
        failure_details,
        record,
        request_requeue,
        stop_attempt,
    )
    from train.stop.causes import exception_line, root_report, rules_of, signature
    from train.stop.claims import attempt_name, claim_hang, hang_claimed, hang_dir, is_claimed
    from train.stop.decision import (
        BUDGET_EXHAUSTED_EXIT_CODE,
        EVENT_OF_KIND,
        REQUEUE_EXIT_CODE,
        Decision,
        decide,
    )
    from train.stop.facts import AskedOnce, StopFacts, end_time, gather, preemption_grace_s
    from train.stop.lead import EarlyStop, early_stop_lead_s, lead_notes, needed_lead_s
    from train.stop.quarantine import explain_previous_attempt
    from train.stop.signals import (
        PreemptionGuard,
        early_signal_pending,
        install_early,
        pop_early_signals,
        signum,
        term_received_at,
    )
    from train.stop.step import after_step
    from train.stop.stopenv import Decider, StopEnv

_EXPORTS = {
    "attempt_fields": "act",
    "carry_out": "act",
    "describe_failure": "act",
    "failure_details": "act",
    "ended_elsewhere": "act",
    "failure_claimed": "act",
    "record": "act",
    "request_requeue": "act",
    "stop_attempt": "act",
    "exception_line": "causes",
    "root_report": "causes",
    "rules_of": "causes",
    "signature": "causes",
    "attempt_name": "claims",
    "claim_hang": "claims",
    "hang_claimed": "claims",
    "hang_dir": "claims",
    "is_claimed": "claims",
    "BUDGET_EXHAUSTED_EXIT_CODE": "decision",
    "Decision": "decision",
    "EVENT_OF_KIND": "decision",
    "REQUEUE_EXIT_CODE": "decision",
    "decide": "decision",
    "AskedOnce": "facts",
    "StopFacts": "facts",
    "end_time": "facts",
    "gather": "facts",
    "preemption_grace_s": "facts",
    "EarlyStop": "lead",
    "early_stop_lead_s": "lead",
    "lead_notes": "lead",
    "needed_lead_s": "lead",
    "explain_previous_attempt": "quarantine",
    "PreemptionGuard": "signals",
    "install_early": "signals",
    "early_signal_pending": "signals",
    "pop_early_signals": "signals",
    "signum": "signals",
    "term_received_at": "signals",
    "after_step": "step",
    "Decider": "stopenv",
    "StopEnv": "stopenv",
}
__all__ = [
    "BUDGET_EXHAUSTED_EXIT_CODE",
    "EVENT_OF_KIND",
    "REQUEUE_EXIT_CODE",
    "AskedOnce",
    "Decider",
    "Decision",
    "EarlyStop",
    "PreemptionGuard",
    "StopEnv",
    "StopFacts",
    "after_step",
    "attempt_fields",
    "attempt_name",
    "carry_out",
    "claim_hang",
    "decide",
    "describe_failure",
    "early_signal_pending",
    "early_stop_lead_s",
    "end_time",
    "ended_elsewhere",
    "exception_line",
    "explain_previous_attempt",
    "failure_claimed",
    "failure_details",
    "gather",
    "hang_claimed",
    "hang_dir",
    "install_early",
    "is_claimed",
    "lead_notes",
    "needed_lead_s",
    "pop_early_signals",
    "preemption_grace_s",
    "record",
    "request_requeue",
    "root_report",
    "rules_of",
    "signature",
    "signum",
    "stop_attempt",
    "term_received_at",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
