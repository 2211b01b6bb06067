"""What a command's supervisor does at a stop (the other half of
:mod:`train.command.supervisor`).

Slurm's signal (or a TERM) arrived: every rank hands the command the signal it saves on at once;
rank 0 gathers the stop's facts and asks the one stop decision (:mod:`train.stop`), records it,
waits for the command within the grace (capped by the partition's GraceTime at a preemption),
and carries the decision out unless the command (Lightning) or Slurm already requeued the job.
What is command-specific lives here: which signal the command gets, and when.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.command import selfrequeue
from train.command.processes import (
    StderrTail,
    StopPlan,
    caught_signals,
    plan_stop,
    signal_group,
    signal_name,
    stop_group,
    wait_exit,
)
from train.command.rootcause import failed_before_term
from train.env import DistEnv
from train.history import RunHistory
from train.procfs import process_tree
from train.runfiles import STOPS, make_dirs, touch
from train.spec import RunConfig
from train.stop import (
    AskedOnce,
    Decision,
    StopFacts,
    attempt_fields,
    carry_out,
    decide,
    failure_claimed,
    gather,
    hang_claimed,
    preemption_grace_s,
    record,
)

if TYPE_CHECKING:
    from cluster import Slurm

__all__ = ["StopHandling"]

log = logging.getLogger("train.command.supervisor")

_REQUEUE_MARGIN_S = 5  # seconds kept for our requeue before Slurm's preemption kill


class StopHandling:
    """The stop half of :class:`train.command.supervisor.CommandRun` (which sets these
    attributes)."""

    config: RunConfig
    env: DistEnv
    run_dir: Path
    history: RunHistory | None
    stops: list[tuple[int, float]]
    grace_s: float
    job_signal: int
    stop_signal: str
    client: Slurm | None
    proc_root: Path
    # this rank's markers of train.command.selfrequeue (None: the command's scontrol is Slurm's)
    requeue_state: Path | None = None
    _stopping_marked = False
    # when the command's processes first wrote (output, a file, a socket): the end of its
    # start-up as far as we can see it (its imports write nothing); on every later event of
    # this process run, for the goodput ledger (jobs/goodput.py)
    first_output_at: float | None = None

    def _append(self, event: str, **fields: Any) -> None:
        if self.history is not None:
            base = self._base()
            self.history.append(event, **base, **fields)

    # -- stops --------------------------------------------------------------------------------
    def _base(self) -> dict[str, Any]:
        base = attempt_fields(self.env, None)
        if self.first_output_at is not None:
            base["first_output_at"] = round(self.first_output_at, 3)
        return base

    def _decide(self, trigger: int) -> tuple[Decision, StopFacts]:
        """Rank 0: the facts of this stop (one ``scontrol show job``) and the decision."""
        asked = AskedOnce(self._client()) if self.env.job_id else None
        claimed = bool(self.env.job_id) and failure_claimed(
            self.run_dir, self.env.job_id, self.env.attempt
        )
        facts = gather(
            "signal",
            job_id=self.env.job_id,
            restart_count=self.env.restart_count,
            run_dir=self.run_dir,
            signal_delay_s=self.config.requeue.signal_delay_s,
            hosts=self.env.hosts,
            node=self.env.node_name,
            client=asked,
            in_place=self.env.in_place_supervised,
            signal=signal_name(trigger),
            failure_claimed=claimed,
            no_rank_failed=not claimed and not self._rank_failed(),
            slurm_release=self.env.slurm_release,
        )
        assert self.history is not None
        counts = self.history.budget_counts(
            self.env.job_id, self.env.restart_count, self.env.submission
        )
        decision = decide("signal", facts, counts, self.config.requeue)
        record(decision, self.history, self._base(), facts, signal=signal_name(trigger))
        if decision.kind == "preemption" and asked is not None:
            self._fit_grace(preemption_grace_s(str(self.env.job_id), asked))
        return decision, facts

    def _mark_stopping(self) -> None:
        """From now on the command's own requeue of its job is this stop's (once)."""
        if not self._stopping_marked and self.requeue_state is not None:
            self._stopping_marked = selfrequeue.mark_stopping(self.requeue_state)

    def _after_stop(self, proc: subprocess.Popen[bytes] | None, tail: StderrTail | None) -> int:
        trigger, at = self.stops[0]
        self._mark_stopping()  # before the command gets its signal from us
        if hang_claimed(self.run_dir, self.env.job_id, self.env.attempt):
            # the hang watcher recorded this attempt's end and requeued the job (Slurm's TERM
            # after that requeue is not a preemption): only stop the command
            log.warning("stop after a hang of this attempt: already recorded and requeued")
            if proc is not None:
                stop_group(proc)
            return 0
        alive = proc is not None and proc.poll() is None
        # Every rank hands the command its signal the moment Slurm's arrives, before rank 0
        # asks Slurm why (a second or more on a busy controller): a program whose handler runs
        # collectives (Lightning saves with a barrier) must get it at the same time everywhere.
        # Rank 0 asks first only for a TERM: it may be a cancel, which stops the command
        # without a save signal. A stop over its budget still saves: nothing is lost.
        at_once = alive and trigger != signal.SIGTERM
        forwarded = self._forward(trigger, proc) if at_once and proc is not None else False
        decision = self._decide(trigger)[0] if self.history is not None else None
        if not at_once and proc is not None and proc.poll() is None:
            if decision is not None and not decision.save:
                plan = StopPlan(None, (), False, True, "no requeue by us: stopping the command")
                log.warning("stop (%s): %s", signal_name(trigger), plan.note)
                forwarded = self._act(plan, proc)
            else:
                forwarded = self._forward(trigger, proc)
        seen = self._wait_child(proc, at + self.grace_s, watch=forwarded)
        exited_at: float | None = time.time()
        self._mark_stopped()
        if decision is None:
            return 0
        if seen == "command":  # the command requeued the job itself: recorded when seen
            return decision.exit_code if decision.exhausted else 0
        if decision.action != "none" and self.env.world_size > 1:
            exited_at = self._wait_ranks(at + self.grace_s)  # None: the grace ended first
        assert self.history is not None
        # No look at Slurm before the requeue (issue 46: the job leaves its nodes one call after
        # the command's exit): a job the command (or Slurm) requeued already is refused a
        # second requeue, and only then is asked who did it. A command we had to stop did not
        # requeue the job after its last look: a requeue seen then is Slurm's (a preemption's
        # grace that ended while it was being stopped).
        # The command's own `scontrol requeue` (Lightning) was handed to us: this one requeue is
        # what it asked for, and a requeue found done is Slurm's (a preemption's, 24.11+)
        asked = selfrequeue.asked(self.requeue_state)
        base = self._base()
        # when this process saw the last rank's command gone: the requeue's time after it is
        # ours (issue 46: the job leaves its nodes within a few hundred ms of that exit)
        if exited_at is not None:
            base["exited_at"] = round(exited_at, 3)
        if asked:
            base["asked_by"] = "command"
            if decision.action != "requeue" and decision.requeued_by is None:
                log.warning("the command asked for a requeue: not requeued (%s)",
                            decision.exhausted or decision.note)  # fmt: skip
        commanded = forwarded and seen != "stopped" and not asked
        return carry_out(decision, self.history, base, self.run_dir, client=self.client,
                         requeued_by=lambda: self._requeued_by_others(commanded))  # fmt: skip

    def _rank_failed(self) -> bool:
        """Whether a rank's command of this attempt failed other than by a TERM (its report):
        a rank's supervisor reports before its task ends, so before srun's TERM to the rest.
        Without one, a TERM is an operator's stop (README), saved like the requeue signal."""
        if not self.env.job_id or self.env.world_size <= 1:
            return False
        return failed_before_term(self.run_dir, self.env.job_id, self.env.attempt)

    def _fit_grace(self, slurm_grace_s: int | None) -> None:
        """A preempted job is killed GraceTime seconds after the signal: stop the command (and
        requeue) before that, so what happens is ours, not Slurm's kill."""
        if slurm_grace_s and slurm_grace_s - _REQUEUE_MARGIN_S < self.grace_s:
            self.grace_s = max(1.0, slurm_grace_s - _REQUEUE_MARGIN_S)
            log.info(
                "the partition's GraceTime is %d s: %.0f s to save", slurm_grace_s, self.grace_s
            )

    def _forward(self, trigger: int, proc: subprocess.Popen[bytes]) -> bool:
        plan = self._plan(trigger, proc.pid)
        log.warning("stop (%s): %s", signal_name(trigger), plan.note)
        return self._act(plan, proc)

    def _plan(self, trigger: int, pid: int) -> StopPlan:
        tree = process_tree(pid, self.proc_root)
        return plan_stop(
            trigger,
            self.job_signal,
            self.stop_signal,
            pid,
            under_slurm=bool(self.env.job_id),
            tree=tree,
            caught=lambda p: caught_signals(p, self.proc_root),
        )

    def _act(self, plan: StopPlan, proc: subprocess.Popen[bytes]) -> bool:
        """Carry out ``plan``; True when the command got a signal to save on."""
        if plan.terminate:
            signal_group(proc.pid, signal.SIGTERM)
            return False
        if plan.signal is None or not plan.targets:
            return plan.by_slurm
        # Only processes of the command's own tree, looked up again now: proof they are ours.
        ours = process_tree(proc.pid, self.proc_root)
        for pid in plan.targets:
            if pid in ours and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, plan.signal)
        return True

    def _wait_child(
        self, proc: subprocess.Popen[bytes] | None, deadline: float, *, watch: bool
    ) -> str | None:
        """Wait for the command to exit (stop it at ``deadline``); rank 0 watches whether the job
        was requeued meanwhile (by the command, e.g. Lightning): recorded at once, ``"command"``.
        ``"stopped"``: the command did not exit by ``deadline`` and was stopped (a last look
        first: a requeue after it is not the command's); None: it exited."""
        if proc is None:
            return None
        next_check = 0.0
        while wait_exit(proc, 0.5) is None:
            now = time.time()
            late = now >= deadline
            # a command whose requeue we took (train.command.selfrequeue) requeued nothing
            watching = (watch and self.history is not None and bool(self.env.job_id)
                        and not selfrequeue.asked(self.requeue_state))  # fmt: skip
            if watching and (now >= next_check or late):
                next_check = now + 2.0
                if self._slurm_restarts() > self.env.restart_count:
                    log.warning("the command requeued the job itself: not requeuing it again")
                    # recorded now: Slurm ends this step any moment after such a requeue
                    self._append("requeue", via="command")
                    wait_exit(proc, max(0.0, deadline - time.time()))
                    stop_group(proc)
                    return "command"
            if late:
                log.warning(
                    "the command did not exit %.0f s after the stop: stopping it", self.grace_s
                )
                stop_group(proc)
                return "stopped"
        return None

    def _slurm_restarts(self) -> int:
        try:
            info = self._client().show_job(str(self.env.job_id))
        except Exception as exc:  # controller busy, job gone: treat as not requeued
            log.debug("scontrol show job failed: %s", exc)
            return -1
        restarts = str(info.get("Restarts", ""))
        return int(restarts) if restarts.isdigit() else -1

    def _requeued_by_others(self, forwarded: bool) -> str | None:
        if not self.env.job_id or self._slurm_restarts() <= self.env.restart_count:
            return None
        return "command" if forwarded else "slurm"

    def _client(self) -> Slurm:
        if self.client is None:
            from cluster import slurm_client  # lazy: train does not need cluster

            self.client = slurm_client(timeout=30, shielded=True)
        return self.client

    # -- ranks ----------------------------------------------------------------------------------
    def _marker_dir(self) -> Path:
        return self.run_dir / STOPS / f"{self.env.job_id}-{self.env.attempt}"

    def _mark_stopped(self) -> None:
        if self.env.world_size > 1:
            try:
                make_dirs(self.run_dir, STOPS, self._marker_dir().name)  # no planted link
                touch(self._marker_dir() / str(self.env.rank))
            except OSError as exc:
                log.warning("cannot mark rank %d stopped (%s)", self.env.rank, exc)

    def _wait_ranks(self, deadline: float) -> float | None:
        """Rank 0 requeues after every rank's command has exited (or the grace time is over):
        when it saw the last of them (one directory listing per look, every 50 ms), None when
        the grace time ended first."""
        while time.time() < deadline:
            try:
                done = len(list(self._marker_dir().iterdir()))
            except OSError:
                done = 0
            if done >= self.env.world_size:
                return time.time()
            time.sleep(0.05)  # a directory listing: cheap; the requeue waits on it
        return None
