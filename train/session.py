"""One run session around any training code: the built-in trainer and both entrypoint kinds.

:class:`RunSession` is the one place that sets a run up and takes it down::

    with RunSession(config.train, config.requeue, env, run_dir, resume=...) as s:
        # s.devices, s.ckpt (CheckpointManager), s.guard (PreemptionGuard), s.rt (Runtime),
        # s.resume_from (agreed by all ranks), s.config_changed (fields, when allowed)
        s.started(step)                       # the start/resume event
        for step in ...:
            ...; s.progress(step)             # cheap; listeners (a hang watchdog) see it
            if s.should_stop():               # every rank, same steps
                save(); return s.stop(step)   # wait, barrier, events, requeue -> exit code
        s.complete(step)
    # an exception in training: code = s.fail(exc, "what failed", step)

Set-up order matters: rank 0 decides where to start (:func:`train.resume.plan_resume`: refuses
a run directory that holds another run's checkpoints or a config change that alters training)
and creates its checkpoint manager, which clears leftovers of interrupted saves, before the
process group exists; every rank then receives the same decision (one broadcast), so no rank can
resume from a different checkpoint than another. A refusal is a :class:`ConfigError` (exit 2) on
every rank.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from train.checkpoint import (
    SAVE_PHASE_HOOKS,
    CheckpointManager,
    Line,
    read_manifest,
    written_split,
)
from train.device import DeviceInfo, resolve_device
from train.env import DistEnv
from train.errors import CheckpointError, ConfigError
from train.hang import Watchdog, start_watchdog
from train.history import RunHistory
from train.resume import ResumePlan, plan_resume, record_config
from train.spec import RequeueConfig, TrainConfig
from train.startup import mark, resume_collector, summary
from train.stop import (
    Decision,
    EarlyStop,
    PreemptionGuard,
    describe_failure,
    early_stop_lead_s,
    end_time,
    ended_elsewhere,
    explain_previous_attempt,
    failure_details,
    needed_lead_s,
    request_requeue,
    signum,
    term_received_at,
)

if TYPE_CHECKING:
    from train.runtime import Runtime

__all__ = ["RunSession"]

log = logging.getLogger(__name__)

ProgressListener = Callable[[int], None]


class RunSession:
    """Environment, device, process group, checkpoints, resume choice, preemption guard, events
    and the stop/failure -> requeue path of one training process (see the module docstring).

    ``resume``: True = newest valid checkpoint, a path = that checkpoint, None = only when
    ``env.restart_count > 0`` (a requeued job). ``guard``: installed by the caller (tests, user
    code) or, when None, installed here for the spec's requeue signal and SIGTERM.
    ``allow_config_change``: resume even though fields that alter training changed.
    ``process_group=False`` (a command entrypoint, whose child joins the process group itself):
    no torch set-up, device or process group here (:attr:`devices` and :attr:`rt` unusable).
    """

    def __init__(
        self,
        train: TrainConfig,
        requeue: RequeueConfig,
        env: DistEnv,
        run_dir: Path,
        *,
        resume: bool | str | Path | None = None,
        guard: PreemptionGuard | None = None,
        devices: DeviceInfo | None = None,
        allow_config_change: bool = False,
        process_group: bool = True,
        prestarted: bool = False,
    ) -> None:
        self.train, self.requeue, self.env = train, requeue, env
        #: a command started before the session (train.command.prestart): its resume decided
        self.prestarted = prestarted and not process_group
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.allow_config_change = allow_config_change or train.allow_config_change
        self._own_guard = guard is None
        self.guard = guard or PreemptionGuard(
            (requeue.signal, "TERM"),
            job_id=env.job_id,
            signal_delay_s=requeue.signal_delay_s,
            is_main=env.is_main,
        )
        self._devices = devices
        self.process_group = process_group
        self._ckpt: CheckpointManager | None = None
        self._rt: Runtime | None = None
        self.resume_from: Path | None = None
        #: the world size the checkpoint resumed from was written at (None: a fresh start)
        self.checkpoint_world_size: int | None = None
        #: the split of the global batch it was trained with (its manifest; None: none recorded)
        self.checkpoint_split: dict[str, int] | None = None
        self.config_changed: tuple[str, ...] = ()
        self.history = RunHistory(self.run_dir) if env.is_main else None
        self._listeners: list[ProgressListener] = []
        self._opened = False
        self.watchdog: Watchdog | None = None
        self.opened_at = time.perf_counter()
        #: why the run stopped: "signal" (a stop signal), the kind Slurm gave it (on the rank
        #: that decided the stop under Slurm), or "failure"
        self.stopped: str | None = None
        self._early_stop: EarlyStop | None = None
        self._early_kind: str | None = None  # "timeout" once the early stop fired

    # -- set-up and take-down ------------------------------------------------------------------
    def open(self) -> RunSession:
        """Set everything up (see the module docstring); raises ConfigError when refused.
        Idempotent: ``with session:`` after ``open()`` does not set up a second time."""
        if self._opened:
            return self
        self._opened = True
        env, train = self.env, self.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.process_group:  # torch: never imported for a command (its child imports it)
            from train.runtime import configure_torch

            configure_torch(train, env)
            if self._devices is None:
                self._devices = resolve_device(env, train.strategy, train.allow_cpu_fallback)
        want = self.resume if self.resume is not None else (True if env.resumed else None)
        plan = ResumePlan()
        # Without a process group (a command entrypoint: its child creates one) every rank
        # reads the same directory and comes to the same decision.
        if self.prestarted:
            # the command started first (train.command.prestart): the decision was made then,
            # before anything of ours existed in checkpoints/ -- nothing to resume from
            self._ckpt = self._manager(tidy=False)
        elif env.is_main or not self.process_group:
            plan = plan_resume(
                want,
                self.run_dir,
                train,
                self._latest_valid,
                allow_change=self.allow_config_change,
                restarted=env.resumed,
                command=not self.process_group,
            )
            if plan.error is None and self._ckpt is None:
                # before any other rank can save: rank 0 clears leftovers of interrupted saves
                self._ckpt = self._manager()
            if plan.error is None and env.is_main:
                try:  # the branch this run follows, recorded before anything trains on it
                    assert self._ckpt is not None
                    self._ckpt.follow(plan.line, record=plan.record, resumed_from=plan.resumed_from)
                except CheckpointError as exc:
                    plan = ResumePlan(error=str(exc))
        if self._own_guard:
            self.guard.install()
        try:
            if self.process_group:
                from train.runtime import setup_runtime

                self._rt = setup_runtime(env, self.devices)
                mark("process_group")
                box: list[Any] = [plan]
                self._rt.broadcast_object(box)  # one decision for every rank
                plan = box[0]
        except BaseException:
            self.close()
            raise
        if plan.error is not None:
            self.close()
            raise ConfigError(plan.error)
        if self._ckpt is None:
            self._ckpt = self._manager()
        self._ckpt.follow(plan.line)  # every rank saves on the line rank 0 chose
        self.resume_from = Path(plan.path) if plan.path else None
        self.checkpoint_world_size, self.checkpoint_split = _written_shape(self.resume_from)
        self.config_changed = plan.changed
        if env.is_main:
            record_config(self.run_dir, train)
        if self.process_group and env.job_id and self.watchdog is None:
            # hang watchdog (train.hang.heartbeat): progress = this session's progress() calls
            self.watchdog = start_watchdog(self.requeue, env, self.run_dir)
            if self.watchdog is not None:
                self.add_progress_listener(self.watchdog.beat)
                SAVE_PHASE_HOOKS.append(self.watchdog.pulse)  # a save's phases are progress
        if env.is_main and env.job_id and self._early_stop is None:
            self._early_stop = self._arm_early_stop()
        return self

    def _arm_early_stop(self) -> EarlyStop | None:
        """When this run's measured stops need more than ``requeue.signal_delay_s``
        (train.stop.lead), stop that much before the time limit: one ``scontrol show job``
        for the job's EndTime, only then."""
        if self.history is None:
            return None
        needed = needed_lead_s(self.history.events())
        if needed is None or needed <= self.requeue.signal_delay_s:
            return None
        end = end_time(str(self.env.job_id))
        if end is None:
            return None
        lead = early_stop_lead_s(needed, self.requeue.signal_delay_s, end - time.time())
        if lead is None:
            return None

        def fire() -> None:
            self._early_kind = "timeout"
            self.guard.trigger(self.requeue.signal)

        return EarlyStop(end, lead, fire).start()

    def _latest_valid(self, line: Line) -> Path | None:
        # only asked when this run resumes its own directory: its leftovers may go
        self._ckpt = self._ckpt or self._manager()
        self._ckpt.follow(line)
        return self._ckpt.latest_valid()

    def _manager(self, tidy: bool = True) -> CheckpointManager:
        env = self.env
        manager = CheckpointManager.for_run(
            self.run_dir, self.train, rank=env.rank, world_size=env.world_size, tidy=tidy
        )
        # rank 0 waiting for the other ranks' files within a save it declared (a background
        # save's wait leaves the training phase alone)
        manager.collect_wait = lambda: self.waiting(within=("save",))
        manager.step_ending = self._step_ending
        return manager

    def _step_ending(self) -> bool:
        """Whether srun is ending this step: this process got SIGTERM and it is not the run's
        stop signal (which starts a save of every rank; with TERM as that signal nothing here
        tells the two apart, and a save waits for its parts as before)."""
        if signum(self.requeue.signal) == signal.SIGTERM:
            return False
        return term_received_at() is not None

    def close(self) -> None:
        """Finish in-flight saves, restore signal handlers, leave the process group."""
        if self._early_stop is not None:
            self._early_stop.cancel()
            self._early_stop = None
        if self.watchdog is not None:
            with contextlib.suppress(ValueError):
                SAVE_PHASE_HOOKS.remove(self.watchdog.pulse)
            self.watchdog.close()
            self.watchdog = None
        try:
            if self._ckpt is not None:
                self._ckpt.close()
        finally:
            if self._own_guard:
                self.guard.uninstall()
            if self._rt is not None:
                rt, self._rt = self._rt, None
                try:
                    rt.close()
                except Exception as exc:
                    if self.stopped is None:
                        raise
                    # The attempt's end is decided and recorded already (a peer died, its
                    # node failed): the stop-flag reduce still in flight with the dead peer
                    # fails here. Raising would record a second failure (train.cli) and turn
                    # the decided exit code into 1.
                    log.warning("leaving the process group after a %s: %s", self.stopped, exc)

    def __enter__(self) -> RunSession:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what the training code uses -----------------------------------------------------------
    @property
    def devices(self) -> DeviceInfo:
        assert self._devices is not None, "RunSession.open() first"
        return self._devices

    @property
    def ckpt(self) -> CheckpointManager:
        assert self._ckpt is not None, "RunSession.open() first"
        return self._ckpt

    @property
    def rt(self) -> Runtime:
        assert self._rt is not None, "RunSession.open() first"
        return self._rt

    def event(self, name: str, step: int | None, **fields: Any) -> None:
        """Append to ``RUN_DIR/events.jsonl`` (rank 0 only)."""
        if self.history is not None:
            self.history.append(
                name,
                step=step,
                restart_count=self.env.restart_count,
                job_id=self.env.job_id,
                **({"in_place": self.env.in_place} if self.env.in_place else {}),
                **({"submission": self.env.submission} if self.env.submission else {}),
                **fields,
            )

    def started(self, step: int | None, **fields: Any) -> None:
        """Record ``start`` or ``resume``; a resume with an allowed config change names the
        changed fields (``config_changed``) and says ``exact: false``."""
        fields.setdefault("startup", summary())  # seconds per start-up phase
        resume_collector()  # start-up is over (train.startup: why it was off)
        if self.history is not None and self.env.restart_count > 0:
            explain_previous_attempt(self.run_dir, self.env.job_id, self.env.restart_count)
        # the shape this attempt runs on (jobs status: "resumed at step N on 1 node (was 2)")
        fields.setdefault("world_size", self.env.world_size)
        fields.setdefault("num_nodes", self.env.num_nodes)  # ("nodes" names hosts)
        if self.env.sluid:  # Slurm's name of this run (24.11+): the ledger's key
            fields.setdefault("sluid", self.env.sluid)
        if self.resume_from is None:
            self.event("start", step, **fields)
            return
        was = self.checkpoint_world_size
        if was is not None and was != self.env.world_size:
            fields.update(was_world_size=was, was_num_nodes=self._nodes_at(was))
            log.warning(
                "resuming on %s rank(s) from a checkpoint written on %s", self.env.world_size, was
            )
        if self.config_changed:
            log.warning(
                "resuming with a changed config (allowed): %s; this is no longer an exact resume",
                "; ".join(self.config_changed),
            )
            fields.update(config_changed=list(self.config_changed), exact=False)
        self.event("resume", step, path=str(self.resume_from), **fields)

    def _nodes_at(self, world_size: int) -> int | None:
        """How many nodes the newest attempt that ran on ``world_size`` ranks had (rank 0)."""
        if self.history is None:
            return None
        for e in reversed(self.history.events()):
            if e["event"] in ("start", "resume") and e.get("world_size") == world_size:
                nodes = e.get("num_nodes")
                return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None
        return None

    def add_progress_listener(self, listener: ProgressListener) -> None:
        """Call ``listener(step)`` at every :meth:`progress` (e.g. a hang watchdog)."""
        self._listeners.append(listener)

    def progress(self, step: int) -> None:
        """Report that optimizer step ``step`` completed on this rank (cheap: no listener, no
        cost beyond a loop over an empty list)."""
        for listener in self._listeners:
            listener(step)

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Declare ``what`` (``"eval"``, ``"save"``, ...) for the time of the block: work that is
        not a step and may take much longer than one. The hang watchdog then allows
        ``max(timeout, train.hang.heartbeat.BUSY_FLOOR_S)`` of silence instead of the step
        timeout (without a watchdog: nothing)."""
        if self.watchdog is None:
            yield
            return
        with self.watchdog.busy(what):
            yield

    @contextlib.contextmanager
    def waiting(self, within: tuple[str, ...] | None = None) -> Iterator[None]:
        """Waiting for the other ranks for the time of the block (a collective, their parts of
        a checkpoint): not work, so the hang watchdog allows only the step timeout (a peer that
        froze meanwhile is a hang then, not after the busy allowance). ``within``: only while
        the rank is in one of these phases (train.hang.heartbeat.Watchdog.waiting)."""
        if self.watchdog is None:
            yield
            return
        with self.watchdog.waiting(within):
            yield

    def should_stop(self, reduce: Callable[[int], int] | None = None) -> bool:
        """Every rank, at the same step boundaries: True when any rank got a stop signal.
        ``reduce`` defaults to a blocking all-reduce (the trainer passes the lagged one)."""
        return self.guard.should_stop(reduce or self.rt.all_reduce_max)

    def stop(
        self, step: int, save: Callable[[], None] | None = None, *, kind: str | None = None
    ) -> int:
        """Stop agreed: record the signal, ``save()`` (if the caller has not saved yet), wait for
        the save, meet at a barrier, record the checkpoint, then requeue; returns the exit code."""
        kind = kind or self._early_kind
        self.stopped = kind or "signal"
        ended = ended_elsewhere(self.env, self.run_dir, kind)
        if ended is not None:
            # the attempt's end is already recorded (a hang watcher's requeue, a failed rank):
            # this stop is its echo (Slurm's TERM, srun ending the step), not a stop of its own
            log.warning("stop after this attempt's %s was recorded: nothing to save", ended)
            self.stopped = ended
            with contextlib.suppress(CheckpointError):
                self.ckpt.wait()  # a save already under way finishes (it needs no other rank)
            return request_requeue(self.env, self.run_dir, self.requeue, kind, step=step)
        # received_at: when this rank's signal arrived (None: another rank's), for jobs drill
        self.event(
            "signal",
            step,
            signal=self.guard.signal_name or "on another rank",
            received_at=self.guard.received_at,
        )
        with self.busy("save"):
            if save is not None:
                save()
            self.ckpt.wait()
        with self.waiting():
            self.rt.barrier()
        # after the barrier: every rank's part of the checkpoint is complete
        path = self.ckpt.path_for(step)
        if path.is_dir():
            # the measured stop (train.stop.lead): signal -> saved on every rank
            arrived = self.guard.received_at
            since = {"since_signal_s": round(time.time() - arrived, 2)} if arrived else {}
            self.event("checkpoint", step, path=str(path), **since)
        return request_requeue(
            self.env,
            self.run_dir,
            self.requeue,
            kind,
            step=step,
            on_decision=self._decided,
            signal=self.guard.signal_name,
        )

    def _decided(self, decision: Decision) -> None:
        # under Slurm the deciding rank knows why the run stopped (TrainResult.stopped)
        if self.env.job_id and decision.kind:
            self.stopped = decision.kind

    def fail(self, exc: BaseException, where: str, step: int | None = None) -> int:
        """A failure in training: log it, record it (first failing rank) and requeue within
        ``requeue.max_failures``; returns the exit code. Bad input is re-raised (exit 2)."""
        what = describe_failure(exc, where)
        self.stopped = "failure"
        return request_requeue(
            self.env, self.run_dir, self.requeue, "failure", step=step, error=what,
            details=failure_details(exc),
        )  # fmt: skip

    def complete(self, step: int | None, **fields: Any) -> None:
        """Record that the run finished."""
        self.event("complete", step, **fields)


def _written_shape(path: Path | None) -> tuple[int | None, dict[str, int] | None]:
    """The world size checkpoint ``path`` was written at and the split it was trained with
    (its manifest), or None; a damaged manifest says nothing here (loading the checkpoint
    fails with the reason)."""
    if path is None:
        return None, None
    try:
        manifest = read_manifest(path)
        return int(manifest["world_size"]), written_split(manifest)
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None, None
