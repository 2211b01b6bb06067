"""``python -m jobs drill RUN --kind preempt|timeout|cancel|fail``: interrupt your own running
job the way Slurm would, wait for it to come back, and say what the interruption cost.

Only what a user may do to their own job (every Slurm command through :mod:`cluster.client`):

- ``preempt``: a real preemption. A one-second job is submitted to a partition with a higher
  PriorityTier over the job's first node (``urgent`` on the local cluster; ``--partition``
  chooses), asking for the whole node, so Slurm preempts ours: signal, grace time, requeue.
- ``timeout``: the job's time limit is lowered to just past ``elapsed + signal lead`` (anyone may
  lower their own limit), so Slurm sends the time-limit signal within a minute; once the job is
  requeued the original limit is put back, and read back to prove it. Slurm lets only root,
  SlurmUser and accounting operators raise a limit again: anyone else is refused BEFORE anything
  is done, with what it would cost (the restarted job would keep the short limit and time out
  again and again until ``requeue.max_timeouts`` is spent), unless they accept that cost
  (``--accept-short-limit``). A drill that fails or is interrupted after lowering the limit
  puts it back before it ends.
- ``cancel``: a plain ``scancel`` (SIGTERM): the run must checkpoint and NOT come back.
- ``fail``: ``scancel --signal=ABRT``: every process of the job's steps dies at once, as in a
  crash (an abort in native code), with no chance to save. (``--signal=KILL`` would not do: Slurm
  turns it into a plain cancel, SIGTERM first.) A job submitted by ``jobs submit`` restarts the
  step in place (its script decides after the step: train.stop.step); a job whose script does
  not, Slurm does not requeue: the drill does what its user would (``scontrol requeue``). Either
  way the run must resume from its newest valid checkpoint, losing at most the steps since it.

Over SSH (``--remote``, :mod:`jobs.remotedrill`) the connection may drop: every read is tried
again with bounded exponential back-off (one line per outage) until the drill's ``--timeout``,
and an action whose reply was lost is never sent again blindly: Slurm is asked first whether it
took effect (the preempting job by a name of its own in the queue, a cancel by the job's state,
a requeue by its restart count), a signal (``--kind fail``) is never sent twice.

A requeued job waits about two minutes (BeginTime) before it may start again; the drill lets it
start at once (``scontrol update StartTime=now``, allowed on one's own job). The report comes
from the run's own records (``events.jsonl``, ``metrics.jsonl``) and Slurm's StartTime:
signal-to-checkpoint seconds (from the signal's arrival, as the trainer records it, to the
checkpoint event; from the drill's action where no arrival is recorded), the last completed
step, the step it resumed from, steps lost and restart-to-first-step seconds (from the restarted
job's StartTime to its first training step).
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from cluster import TERMINAL_STATES
from jobs.errors import JobsError, UsageError
from jobs.follow import Outage
from jobs.records import RunRecord
from train.history import RunHistory
from train.report import REPORT_KIND
from train.runfiles import (
    DRILL_DIR,
    EVENT_KINDS,
    METRICS_FILE,
    RESOLVED,
    LinkRefusedError,
    make_dirs,
    write_text,
)
from train.schema import METRIC, read_records

if TYPE_CHECKING:
    from cluster import Slurm

T = TypeVar("T")

# the drills, in the table's order of the events they produce (train.runfiles.EVENT_KINDS)
KINDS = tuple(k.drill for k in EVENT_KINDS if k.drill)
_STOP_EVENTS = frozenset(k.name for k in EVENT_KINDS if k.drill)
_TERMINAL = TERMINAL_STATES  # the controller's word (scontrol show job): final
#: A requeued job's states once the requeue settled: waiting, or already started again.
_REQUEUED = frozenset({"PENDING", "EXPEDITING", "CONFIGURING", "RUNNING"})


class DrillError(JobsError):
    """The drill could not do or see what it needed (the message says what)."""


@dataclass
class DrillReport:
    """What one drill did and measured (``--json`` prints :meth:`to_dict`)."""

    run_id: str
    job_id: str
    kind: str
    action: str = ""
    outcome: str = ""
    stop_event: str | None = None
    signal_to_checkpoint_s: float | None = None
    last_completed_step: int | None = None
    checkpoint_step: int | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    restart_to_first_step_s: float | None = None
    # a command's own steps, where it reports them (train.report): the first step it reported
    # after the restart, and how many steps apart its reports are (the error of the rows above)
    first_step_after_restart: int | None = None
    report_interval: int | None = None
    # Slurm's requeue hold (BeginTime, cred_expire: 120-148 s on idle nodes) the drill released:
    # what a real stop waits on top of the restart (issue 46)
    held_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        def show(value: Any, unit: str = "") -> str:
            if value is None:
                return "n/a"
            return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"

        about = f" (+-{self.report_interval}: reported every {self.report_interval})"
        approx = about if self.report_interval and self.report_interval > 1 else ""
        rows = [
            ("action", self.action, ""),
            ("recorded as", self.stop_event, ""),
            ("signal to checkpoint", self.signal_to_checkpoint_s, " s"),
            ("last completed step", self.last_completed_step, approx),
            ("checkpoint step", self.checkpoint_step, ""),
            ("resumed from step", self.resumed_from_step, ""),
            ("first step after", self.first_step_after_restart, ""),
            ("steps lost", self.steps_lost, approx),
            ("restart to first step", self.restart_to_first_step_s, " s"),
            ("Slurm's requeue hold", self.held_s, " s (released by the drill)"),
        ]
        out = [f"drill {self.kind} of {self.run_id} (job {self.job_id}): {self.outcome}"]
        # a row the drill cannot know is not printed (a command that reports no steps)
        out.extend(
            f"  {name:<24}{show(value, unit)}" for name, value, unit in rows if value is not None
        )
        out.extend(f"  note: {n}" for n in self.notes)
        return out


def _slurm_time(value: str | None) -> float | None:
    """A Slurm timestamp (local time, no zone) as epoch seconds; None when unset."""
    if not value or value.strip().lower() in ("unknown", "none", "n/a", "(null)"):
        return None
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _time(event: dict[str, Any]) -> float:
    """An event's time (typed by train.schema: a finite number, or absent: 0)."""
    return float(event.get("time") or 0.0)


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_int_text(value: str | None) -> int:
    """A count in ``scontrol show job`` (``Restarts=1``); 0 where absent or not a number."""
    return int(value) if value and value.isdigit() else 0


class RunFiles:
    """The run's files as the drill reads them, here (the run directory itself): ``dir`` is
    where ``events.jsonl``, ``metrics.jsonl`` and ``resolved.yaml`` are read; :meth:`refresh`
    is called once per poll (here: nothing to do; over SSH, :mod:`jobs.remotedrill`: one ssh
    command brings their new bytes into a local copy)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(run_dir)

    def refresh(self) -> None:
        """Bring the files up to date (once per poll)."""

    def polled_job(self) -> dict[str, str] | None:
        """Slurm's ``scontrol show job`` of the drilled job as the last :meth:`refresh` brought
        it in the same round trip (over SSH: one command per poll), None: ask Slurm."""
        return None

    def uid(self) -> int:
        """The uid that acts on the job (Slurm lets only its owner drill it)."""
        return os.geteuid()

    def write_script(self, text: str) -> str:
        """Write the preempting job's script (``DRILL_DIR/preempt.sbatch``, never through a
        link); its path as Slurm's ``sbatch`` will read it."""
        where = self.dir / DRILL_DIR / "preempt.sbatch"
        try:
            script = make_dirs(self.dir, DRILL_DIR) / "preempt.sbatch"  # never through a link
            write_text(script, text)
        except LinkRefusedError:
            raise  # the owner's own word (a planted link: bad input)
        except OSError as exc:  # not writable by this user (a colleague's run directory)
            raise DrillError(f"cannot write {where} ({exc.strerror})") from None
        return str(script)


class Drill:
    """One drill against one recorded Slurm run (see the module docstring)."""

    def __init__(
        self,
        record: RunRecord,
        client: Slurm,
        kind: str,
        *,
        timeout_s: float = 900.0,
        partition: str | None = None,
        poll_s: float = 1.0,
        say: Callable[[str], None] = lambda line: None,
        accept_short_limit: bool = False,
        files: RunFiles | None = None,
    ) -> None:
        if kind not in KINDS:
            raise UsageError(f"drill: --kind {kind!r}: choose one of {', '.join(KINDS)}")
        if record.executor != "slurm" or not record.job_id:
            raise UsageError(
                f"drill: {record.run_id} is a {record.executor} run; drills need Slurm"
            )
        if record.array_size is not None:
            raise UsageError(f"drill: {record.run_id} is a job array; drill one plain job")
        self.record, self.client, self.kind = record, client, kind
        self.job_id = record.job_id
        run_dir = Path(record.tasks[0].run_dir if record.tasks else record.run_dir)
        # where the run's files are read: here, or a copy of the remote ones (one ssh a poll)
        self.files = files if files is not None else RunFiles(run_dir)
        self.run_dir = self.files.dir
        self.timeout_s, self.partition, self.poll_s, self.say = timeout_s, partition, poll_s, say
        self.report = DrillReport(record.run_id, self.job_id, kind)
        self.accept_short_limit = accept_short_limit
        self.in_place = False  # a fail drill's job restarted its step in place
        self._original_limit = ""  # set once the drill lowered the limit
        self._restored = False
        self._polled: dict[str, str] | None = None  # this poll's show job, with the files
        self._until: float | None = None  # the deadline of the wait under way
        self._outage = Outage()  # a remote host that went away (over SSH)
        self._unanswered = ""  # an action whose reply was lost and was not sent again

    # -- reading -----------------------------------------------------------------------------
    def job(self) -> dict[str, str]:
        """``scontrol show job``: this poll's answer where the files' refresh brought it (the
        first read after it), else one query."""
        polled, self._polled = self._polled, None
        if polled is not None:
            return polled
        return self._reach("Slurm's answer", lambda: self.client.show_job(self.job_id))

    # -- a connection that goes away (over SSH) ----------------------------------------------
    def _reach(self, what: str, ask: Callable[[], T], until: float | None = None) -> T:
        """``ask`` (a read, or an action that may be repeated) tried again with bounded
        exponential back-off while the host cannot be reached, until the deadline of the wait
        under way (else the drill's --timeout from now): one line when the connection goes, one
        when it is back. Slurm's own refusals are not retried."""
        from cluster import SshConnectionError

        end = until or self._until or time.monotonic() + self.timeout_s
        while True:
            try:
                got = ask()
            except SshConnectionError as exc:
                self._lost(exc, end, what)
                continue
            if self._outage.over():
                self.say("connected again; the drill goes on")
            return got

    def _lost(self, exc: Exception, end: float, what: str) -> None:
        now = time.monotonic()
        if now >= end:
            raise DrillError(
                f"drill {self.kind}: gave up after {self.timeout_s:.0f} s without a connection "
                f"({what}): {exc}; nothing more is done to job {self.job_id} (see python -m "
                f"jobs status {self.record.run_id})"
            )
        delay = self._outage.delay()
        if self._outage.tries == 1:  # one line per outage
            self.say(
                f"{exc}; trying again with back-off for up to {self.timeout_s:.0f} s "
                "(the run goes on)"
            )
        time.sleep(min(delay, end - now))

    def _act(self, what: str, do: Callable[[], T], took: Callable[[], bool] | None) -> T | None:
        """One action on the job, never repeated blindly: where its reply is lost (the
        connection dropped: it may or may not have reached Slurm), the drill waits for the host
        with back-off, then asks Slurm whether it took effect (``took``) and sends it again only
        where it did not. ``took`` None: an effect not to be told apart yet (a signal): never
        sent again, the wait that follows sees it or gives up. None: sent, its reply lost."""
        from cluster import SshConnectionError

        end = time.monotonic() + self.timeout_s
        while True:
            try:
                return do()
            except SshConnectionError as exc:
                self.say(f"{what}: the reply was lost ({exc}); checking before sending it again")
                if took is None:
                    self._unanswered = what
                    self.report.notes.append(
                        f"{what}: its reply was lost; not sent again (a second one could hit "
                        "the job after its restart)"
                    )
                    return None
                if self._reach(f"checking whether {what} took effect", took, end):
                    self.say(f"{what}: Slurm shows it took effect; not sent again")
                    return None
                if time.monotonic() >= end:
                    raise DrillError(
                        f"drill {self.kind}: gave up after {self.timeout_s:.0f} s: {what} "
                        f"did not reach Slurm ({exc})"
                    ) from None

    def restarts(self) -> int:
        value = self.job().get("Restarts", "0")
        return int(value) if value.isdigit() else 0

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in RunHistory(self.run_dir).events() if _time(e) >= since]

    def train_steps(self) -> list[tuple[float, int]]:
        """(time, step) of the run's training records (``metrics.jsonl``)."""
        out = []
        for rec in read_records(self.run_dir / METRICS_FILE, METRIC):
            step, when = _as_int(rec.get("step")), rec.get("time")
            kind = rec.get("kind")
            if (
                kind in ("train", REPORT_KIND)
                and step is not None
                and isinstance(when, int | float)
            ):
                out.append((float(when), step))
        return out

    def _refresh(self) -> None:
        """The run's files as they are now and, where the same round trip brought it, Slurm's
        answer for the job (read by the next :meth:`job`)."""
        self._reach("reading the run's files", self.files.refresh)
        self._polled = self.files.polled_job()

    def wait(self, what: str, predicate: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.timeout_s
        self._until = deadline
        try:
            while True:
                self._refresh()  # once per poll: the run's files as they are now
                try:
                    if predicate():
                        return
                finally:
                    self._polled = None  # never read by a later poll
                if time.monotonic() > deadline:
                    lost = (
                        f"; the reply to {self._unanswered} was lost and it was not sent again"
                        if self._unanswered
                        else ""
                    )
                    raise DrillError(
                        f"drill {self.kind}: gave up after {self.timeout_s:.0f} s waiting for "
                        f"{what} (job {self.job_id}; see python -m jobs status "
                        f"{self.record.run_id}){lost}"
                    )
                time.sleep(self.poll_s)
        finally:
            self._until = None

    # -- the drill -----------------------------------------------------------------------------
    def run(self) -> DrillReport:
        self._refresh()
        self._check_owner()  # before anything is done to the job
        self.say(f"waiting for job {self.job_id} to train")
        self.wait("the job to run and train", self._training)
        restarts = self.restarts()
        if self.kind == "timeout":
            self._can_restore_limit()  # before anything is done to the job
        self._polled = None
        t0 = time.time()
        try:
            getattr(self, f"_do_{self.kind}")()
            self.say(self.report.action)
            if self.kind == "cancel":
                self.wait("the job to end", lambda: self.job().get("JobState") in _TERMINAL)
                self.wait("the run's stop record", lambda: self._stop_event(t0) is not None)
            elif self.in_place:
                self.wait("the job to train again", lambda: self._resumed(t0, restarts) is not None)
            else:
                self.wait("the job to be requeued", lambda: self._requeued(restarts))
                self._restore_time_limit()
                if self.job().get("JobState") == "PENDING":
                    self._note_hold()
                    self._act(
                        "the release (StartTime=now)",
                        lambda: self.client.release(self.job_id),
                        lambda: self.job().get("Reason") != "BeginTime",
                    )
                    self.say("requeued; released from its BeginTime wait")
                else:
                    self.say("requeued; started again at once (an expedited requeue: no wait)")
                self.wait("the job to train again", lambda: self._resumed(t0, restarts) is not None)
        finally:
            self._restore_time_limit()  # a drill that gave up leaves no short limit behind
        self._measure(t0, restarts)
        return self.report

    def _check_owner(self) -> None:
        """A drill interrupts your own job: another user's (a colleague's run directory on the
        shared file system) is refused in one line before anything is done, rather than by
        Slurm halfway through (``scancel``/``scontrol`` refuse a job that is not the caller's:
        the time limit would be lowered, then unknown). Root may drill any job."""
        from cluster import parse_user_id

        me = self.files.uid()
        owner = parse_user_id(self.job().get("UserId", ""))
        if me == 0 or owner is None or owner[1] == me:
            return
        name = owner[0] or str(owner[1])
        raise UsageError(
            f"drill: job {self.job_id} ({self.record.run_id}) belongs to {name}, not to you "
            f"(uid {me}): Slurm lets only a job's owner or an operator signal, requeue or "
            "change it; drill a run you submitted"
        )

    def _training(self) -> bool:
        state = self.job().get("JobState")
        if state in _TERMINAL:
            raise DrillError(f"drill: job {self.job_id} already ended ({state})")
        started = [e for e in self.events() if e["event"] in ("start", "resume")]
        if state != "RUNNING" or not started:
            return False
        # the built-in trainer logs its steps; a command's own steps are unknown to us. The
        # attempt running now must have trained: steps of an earlier attempt (before a restart
        # in place, say) are not what this drill interrupts
        since = max(_time(e) for e in started)  # the newest start: the attempt running now
        return self._command() or any(t >= since for t, _ in self.train_steps())

    def _attempt_start(self, before: float) -> float:
        """When the attempt running at ``before`` started: its newest start or resume record
        (a requeue and a restart in place each write one); 0 where there is none."""
        starts = [e for e in self.events() if e["event"] in ("start", "resume")]
        return max((_time(e) for e in starts if _time(e) <= before), default=0.0)

    def _command(self) -> bool:
        """A run of the user's own code (its start records name the entrypoint), or a run that
        logs no steps of the built-in trainer."""
        starts = [e for e in self.events() if e["event"] == "start"]
        if any("entrypoint" in e for e in starts):
            return True
        return not (self.run_dir / METRICS_FILE).exists()

    def _requeued(self, before: int) -> bool:
        """Requeued: waiting (PENDING), or started again at once (an expedited requeue, 25.11+:
        it never waits, so a drill that waited for PENDING gave up while the job timed out
        again and again on the short limit)."""
        info = self.job()
        return int(info.get("Restarts", "0") or 0) > before and info.get("JobState") in _REQUEUED

    def _stop_event(self, since: float) -> dict[str, Any] | None:
        return next((e for e in self.events(since) if e["event"] in _STOP_EVENTS), None)

    def _resumed(self, since: float, restarts: int) -> dict[str, Any] | None:
        starts = [
            e
            for e in self.events(since)
            if e["event"] in ("start", "resume")
            and (
                (_as_int(e.get("restart_count")) or 0) > restarts
                or (_as_int(e.get("in_place")) or 0) > 0  # a new step in the same allocation
            )
        ]
        if not starts:
            return None
        after = _time(starts[0])
        if self._command():
            return starts[0]
        return starts[0] if any(t >= after for t, _ in self.train_steps()) else None

    # -- actions (only what a user may do to their own job) ----------------------------------------
    def _do_preempt(self) -> None:
        info = self.job()
        from cluster import expand_hostlist

        node = expand_hostlist(info.get("NodeList", ""))[0]
        name = self.partition or self._preempting_partition(info.get("Partition", ""), node)
        try:  # the same text again where a reply is lost: a repeat is harmless
            script = self._reach(
                "writing the preempting job's script",
                lambda: self.files.write_script("#!/bin/bash\nsleep 1\n"),
            )
        except DrillError as exc:
            raise DrillError(f"drill: {exc}; nothing was done to job {self.job_id}") from None
        # a name of its own: where sbatch's reply is lost, the queue says whether it was sent
        tag = f"drill-preempt-{secrets.token_hex(4)}"
        before = _as_int_text(info.get("Restarts"))
        args = [f"--partition={name}", f"--nodelist={node}", "--exclusive", "--time=1"]
        args += [f"--job-name={tag}", "--output=/dev/null"]
        urgent = self._act(
            "the preempting job's sbatch",
            lambda: self.client.submit(script, args),
            lambda: self._preempt_sent(tag, before),
        )
        which = f"job {urgent}" if urgent is not None else f"a job ({tag})"
        self.report.action = f"submitted {which} to partition {name} needing all of {node}"

    def _preempt_sent(self, tag: str, restarts: int) -> bool:
        """Whether a preempting job whose sbatch reply was lost reached Slurm: it is queued,
        or it already ran (the drilled job was preempted: no longer running, or restarted)."""
        if any(j.name == tag for j in self.client.queue().values()):
            return True
        info = self.job()
        return info.get("JobState") != "RUNNING" or _as_int_text(info.get("Restarts")) > restarts

    def _preempting_partition(self, ours: str, node: str) -> str:
        parts = self._reach("the partitions", self.client.partitions)
        tier = next((p.priority_tier for p in parts if p.name == ours), 0)
        better = [p for p in parts if p.priority_tier > tier and node in p.nodes]
        if not better:
            raise UsageError(
                f"drill: no partition with a higher PriorityTier than {ours!r} covers {node}: "
                "nothing a user may submit preempts this job (--kind timeout drills the same path)"
            )
        return max(better, key=lambda p: p.priority_tier).name

    def _do_timeout(self) -> None:
        info = self.job()
        self._original_limit = info.get("TimeLimit", "")
        if not self._original_limit:
            raise DrillError(f"drill: job {self.job_id} shows no TimeLimit; nothing was changed")
        start = _slurm_time(info.get("StartTime")) or time.time()
        lead = self._signal_lead()
        minutes = math.ceil((time.time() - start + lead) / 60) + 1
        # an absolute limit: sending it again where its reply is lost changes nothing
        self._reach(
            "lowering the limit", lambda: self.client.set_time_limit(self.job_id, str(minutes))
        )
        self._restored = False
        self.report.action = (
            f"lowered the time limit from {self._original_limit} to {minutes} min "
            f"(the {lead:.0f} s signal lead starts within a minute)"
        )

    def _signal_lead(self) -> float:
        """The spec's requeue.signal_delay_s (from the run's resolved.yaml), 90 s if unreadable."""
        import yaml

        resolved = self.run_dir / RESOLVED
        try:
            data = yaml.safe_load(resolved.read_text(encoding="utf-8")) or {}
            return float(data.get("requeue", {}).get("signal_delay_s", 90))
        except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
            return 90.0

    def _can_restore_limit(self) -> None:
        """Refuse the timeout drill (one line, before acting) where its short limit could not
        be put back, unless the user accepts what that costs."""
        if self._reach("the operators", self.client.may_raise_time_limits):
            return
        info = self.job()
        cost = (
            f"only an operator may raise a time limit again, so job {self.job_id} would keep "
            f"the short limit (not its {info.get('TimeLimit', '?')}) after the drill and time out "
            "again at every restart until requeue.max_timeouts is spent"
        )
        if not self.accept_short_limit:
            raise UsageError(
                f"drill --kind timeout: {cost}; drill --kind preempt instead (the same "
                "checkpoint, requeue and resume), or add --accept-short-limit to pay that"
            )
        self.report.notes.append(f"accepted before acting: {cost}")

    def _restore_time_limit(self) -> None:
        """Put the original limit back and read it back; the report says when it is not."""
        original = self._original_limit
        if self.kind != "timeout" or not original or self._restored:
            return
        self._restored = True
        from cluster import ClusterError, parse_slurm_time

        try:  # the same absolute limit again where a reply is lost
            self._reach(
                "restoring the limit", lambda: self.client.set_time_limit(self.job_id, original)
            )
            now = self.job().get("TimeLimit", "")
            same = parse_slurm_time(now) == parse_slurm_time(original)
        except (ClusterError, DrillError) as exc:  # a malformed time string (SlurmTimeError)
            now, same = f"unknown ({str(exc).splitlines()[0] if str(exc) else exc})", False
        if same:
            self.report.notes.append(f"time limit restored to {original} (read back)")
        else:
            self.report.notes.append(
                f"the time limit is {now}, not the original {original}: only an operator may "
                "raise it; until then every restart times out early"
            )
            self.say(self.report.notes[-1])

    def _do_cancel(self) -> None:
        # Slurm marks a cancelled job CANCELLED at once: still RUNNING, the scancel never came
        self._act(
            "scancel",
            lambda: self.client.cancel([self.job_id]),
            lambda: self.job().get("JobState") != "RUNNING",
        )
        self.report.action = "scancel (SIGTERM, as a user cancelling the job)"

    def _do_fail(self) -> None:
        t0 = time.time()
        # never sent twice: a second ABRT would kill the step that restarted in place
        self._act(
            "scancel --signal=ABRT", lambda: self.client.cancel([self.job_id], signal="ABRT"), None
        )
        self.wait(
            "the killed job to end or restart its step in place",
            lambda: (
                self.job().get("JobState") in _TERMINAL or self._restarted_in_place(t0) is not None
            ),
        )
        if self._restarted_in_place(t0):
            # the job's script restarted the step in the same allocation (train.stop.step)
            self.in_place = True
            self.report.action = (
                "scancel --signal=ABRT (every process of the job's step dies, no chance to "
                "save); the job restarted its step in place, no requeue needed"
            )
            return
        before = self.restarts()
        self._act(
            "scontrol requeue",
            lambda: self.client.requeue(self.job_id),
            lambda: self.restarts() > before or self.job().get("JobState") == "PENDING",
        )
        self.report.action = (
            "scancel --signal=ABRT (every process of the job dies, no chance to save); "
            "then scontrol requeue, as its user would after a crash"
        )

    def _restarted_in_place(self, since: float) -> dict[str, Any] | None:
        return next((e for e in self.events(since) if e["event"] == "restart_in_place"), None)

    # -- measuring ---------------------------------------------------------------------------
    def _note_hold(self) -> None:
        """How long Slurm would hold the requeued job (its BeginTime: StartTime, one
        ``scontrol show job``): released by the drill, waited by a real stop."""
        info = self.job()
        until = _slurm_time(info.get("StartTime")) if info.get("Reason") == "BeginTime" else None
        if until is None:
            return
        self.report.held_s = round(max(0.0, until - time.time()), 1)

    def _cost_note(self) -> None:
        r = self.report
        if r.held_s is None or r.restart_to_first_step_s is None:
            return
        held, restart = r.held_s, r.restart_to_first_step_s
        r.notes.append(
            f"a real stop also waits Slurm's requeue hold: about {held + restart:.0f} s from the "
            f"requeue to training ({held:.0f} s held + {restart:.1f} s restart); the drill "
            "released the hold at once (requeue.mode: fastest queues a successor ahead "
            "instead, which starts without it)"
        )

    def _measure(self, t0: float, restarts: int) -> None:
        r = self.report
        self._refresh()
        events = self.events(t0 - 1)
        stop = self._stop_event(t0 - 1)
        r.stop_event = stop["event"] if stop else None
        checkpoint = next((e for e in events if e["event"] == "checkpoint"), None)
        if checkpoint is not None:
            r.checkpoint_step = _as_int(checkpoint.get("step"))
            # from the signal's arrival (the trainer records it), else from the drill's action
            signal = next((e for e in events if e["event"] == "signal"), {})
            arrived = signal.get("received_at")
            since = float(arrived) if isinstance(arrived, int | float) else t0
            r.signal_to_checkpoint_s = round(_time(checkpoint) - since, 2)
        resumed = self._resumed(t0, restarts) if self.kind != "cancel" else None
        until = _time(resumed) if resumed else time.time()
        # the steps of the attempt the drill stopped: an earlier attempt may have gone further
        # (its steps past its last save were lost then, and counted by that drill)
        since = self._attempt_start(t0)
        before = [s for t, s in self.train_steps() if since <= t < until]
        stop_step = _as_int(stop.get("step")) if stop else None
        known = [*before, *([stop_step] if stop_step is not None else [])]
        r.last_completed_step = max(known) if known else None
        if self.kind == "cancel":
            r.outcome = "cancelled, not requeued" if r.stop_event == "cancelled" else "stopped"
            if r.checkpoint_step is not None and r.last_completed_step is not None:
                r.steps_lost = r.last_completed_step - r.checkpoint_step
            return
        assert resumed is not None
        r.resumed_from_step = _as_int(resumed.get("step"))
        if r.resumed_from_step is not None and r.last_completed_step is not None:
            r.steps_lost = r.last_completed_step - r.resumed_from_step
        restart = self._restarted_in_place(t0 - 1) if self.in_place else None
        start = _time(restart) if restart else _slurm_time(self.job().get("StartTime"))
        first = min((t for t, _ in self.train_steps() if t >= _time(resumed)), default=None)
        if start is not None and first is not None:
            r.restart_to_first_step_s = round(first - start, 2)
        if self._command():
            self._measure_command(resumed)
        else:
            r.outcome = (
                f"back: resumed at step {r.resumed_from_step}"
                if r.resumed_from_step is not None
                else "back: restarted (no step recorded since)"
            )
        if self.in_place:
            r.outcome += " (restarted in place, the same allocation)"
        self._cost_note()
        if self.kind == "fail" and r.stop_event is None:
            r.notes.append(
                "a hard kill records nothing: the last completed step is the newest "
                "logged one (train.log_interval)"
            )

    def _measure_command(self, resumed: dict[str, Any]) -> None:
        """Where a command resumed, from what it reports (train.report): the first step after
        the restart against its first step ever and the last step before the stop."""
        r = self.report
        after = _time(resumed)
        if self.kind != "cancel" and any(True for _ in self.train_steps()):
            deadline = time.monotonic() + min(self.timeout_s, 120.0)
            while not any(t >= after for t, _ in self.train_steps()):
                if time.monotonic() > deadline:
                    break
                time.sleep(self.poll_s)
                self._refresh()
                self._polled = None
        steps = self.train_steps()
        if not steps:
            r.outcome = "back: restarted; whether your code resumed is not known"
            r.notes.append(
                "your command reports no steps: call train.report(step) every N steps "
                "(README: Bring your own training code) and a drill says where it resumed"
            )
            return
        ordered = sorted(s for _, s in steps)
        gaps = [b - a for a, b in itertools.pairwise(ordered) if b > a]
        r.report_interval = sorted(gaps)[len(gaps) // 2] if gaps else 1
        first_ever = min(ordered)
        later = [(t, s) for t, s in steps if t >= after]
        if not later:
            r.outcome = "back: restarted; no step reported since the restart yet"
            return
        r.first_step_after_restart = min(later)[1]
        r.resumed_from_step = None  # known to the command only; the first step after says it
        if r.last_completed_step is not None:
            r.steps_lost = max(0, r.last_completed_step - r.first_step_after_restart + 1)
            r.steps_lost += r.report_interval - 1  # the steps since its last report
        if r.first_step_after_restart <= first_ever:
            r.outcome = f"back: started over (first step after the restart: {first_ever})"
        else:
            r.outcome = (
                f"back: resumed (first step reported after the restart: "
                f"{r.first_step_after_restart})"
            )


def run_drill(
    record: RunRecord,
    client: Slurm,
    kind: str,
    *,
    timeout_s: float = 900.0,
    partition: str | None = None,
    progress: IO[str] | None = None,
    accept_short_limit: bool = False,
    files: RunFiles | None = None,
) -> DrillReport:
    """Run one drill and return its report (see the module docstring)."""

    def say(line: str) -> None:
        if progress is not None:
            progress.write(f"drill: {line}\n")
            progress.flush()

    drill = Drill(
        record,
        client,
        kind,
        timeout_s=timeout_s,
        partition=partition,
        say=say,
        accept_short_limit=accept_short_limit,
        files=files,
    )
    return drill.run()
