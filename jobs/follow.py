"""Following a run (``submit --follow``, ``logs -f``): its files every second, Slurm rarely.

Progress comes from the run's own files, read once a second at no cost to anyone: the per-rank
log (``slurm/JOB_RANK_log.out``) and train's ``events.jsonl``. Slurm is asked about the job's
state by :class:`Poller`'s schedule, ONE command per poll (:func:`jobs.statecache.slurm_states`):
every ``min_s`` (3 s) while things change, backing off to one poll every ``max_s`` (60 s) as
the job stays calm (a day-long job costs ~1,500 queries, not 170,000), and at once again when
the files show that the job started, stopped, was requeued or ended.

What a person sees (``--json``: the same as one JSON object a line, nothing else)::

    10:49:01 job 75: RUNNING
    10:49:04 training tinycnn/ddp on cpu: 2 rank(s), ...
    10:49:05 step 20/60 (33%) epoch 0 | loss 2.3307 acc 16.1% | lr 0.05 | 921 img/s
    10:49:09 >> preempted at step 40, checkpoint step-40
    10:49:09 >> requeued (scontrol)
    10:51:30 >> resumed at step 40 (restart 1)
    10:51:41 >> complete at step 60, test acc 14.1%
    10:51:42 job 75: COMPLETED

submitit's own log lines (each also arrives through train's logging, so twice) are dropped at
INFO and shown once at WARNING and above; train's ``TIME [rank R] LEVEL logger:`` prefix is
shortened to the time, and a line of the command's own output (no time of its own) gets the time
it was read: every line starts with its time. Slurm's notes on a step it ended
(``slurmstepd: error: *** JOB 13 ON n1 CANCELLED AT ... DUE TO JOB REQUEUE ***``, srun's
``Job step aborted``) are what a preemption, a time limit or a requeue looks like from inside the
step, not errors: they are shown as one plain line (``Slurm ended the step: job requeue``), or
not at all where the run's own events say it. Lines are shown in time order: what was read is
held for :data:`REORDER_S` before it is shown, so that a record written a moment late (an event
stamped before a log line that was read first) still comes before it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cluster import JobInfo
from jobs.records import RunRecord
from train.runfiles import CHECKPOINTS, EVENTS_FILE, events_where
from train.schema import EVENT, check_lines, report

if TYPE_CHECKING:
    from cluster import Slurm

ClientFactory = Callable[[], "Slurm"]
UNKNOWN_GIVE_UP_S = 60.0
CHUNK = 1 << 20  # the most of a file one read holds (a GiB of new log: 1024 pieces)
MIN_POLL_S = 3.0
MAX_POLL_S = 60.0
# Events after which Slurm's view of the job changes (or the run is over): ask at once.
_HURRY = events_where(asks_slurm=True)
_FINAL_EVENTS = events_where(final=True)
_OURS = re.compile(r"^(\d\d:\d\d:\d\d) \[rank (\d+)\] ([A-Z]+) ([\w.]+): (.*)$")
# slurmstepd's note on a step or job it ended, and srun's chatter while a step is torn down
_STEPD = re.compile(
    r"^(?:slurmstepd|srun): error: \*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+"
    r"(?: DUE TO ([A-Z _]+?))?(?: \*\*\*)?$"
)
_SRUN_TEARDOWN = re.compile(
    r"^srun: (?:Job step aborted: Waiting up to \d+ seconds for job step to finish\.|"
    r"forcing job termination|got SIGCONT|Cancelled pending job step with signal \d+|"
    r"error: Timed out waiting for job step to complete)$"
)
#: How long what was read is held before it is shown (in time order with what comes later).
REORDER_S = 1.5
_SUBMITIT = re.compile(r"^submitit ([A-Z]+) \(\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d),\d+\) - (.*)$")


#: back-off between tries while a remote host cannot be reached (``--remote``: a follow, a drill)
RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)


class Outage:
    """A connection that went away and its bounded exponential back-off (:data:`RETRY_S`): the
    caller says one line when it goes (:attr:`tries` is 1 after the first :meth:`delay`) and one
    when it is back (:meth:`over`)."""

    def __init__(self) -> None:
        self.tries = 0

    def delay(self) -> float:
        """Seconds to wait before the next try."""
        wait = RETRY_S[min(self.tries, len(RETRY_S) - 1)]
        self.tries += 1
        return wait

    def over(self) -> bool:
        """The connection answers again: whether it had gone (the caller says so once)."""
        was, self.tries = self.tries > 0, 0
        return was


class Poller:
    """When to ask Slurm next: ``min_s`` apart right after a change, then one poll per
    ``calm / ratio`` seconds of calm (capped at ``max_s``); :meth:`hurry` asks at once."""

    def __init__(
        self,
        min_s: float = MIN_POLL_S,
        max_s: float = MAX_POLL_S,
        ratio: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_s, self.max_s, self.ratio, self.clock = min_s, max(min_s, max_s), ratio, clock
        now = clock()
        self.calm_since = now
        self.next_at = now  # the first poll is at once
        self.urgent = True
        self.polls = 0

    def interval(self) -> float:
        calm = self.clock() - self.calm_since
        return min(self.max_s, max(self.min_s, calm / self.ratio))

    def due(self) -> bool:
        return self.clock() >= self.next_at

    def hurry(self) -> None:
        """The files show a change: poll now (and keep polling often for a while)."""
        self.calm_since = self.clock()
        self.next_at = min(self.next_at, self.clock())
        self.urgent = True

    def soon(self) -> None:
        """Confirm something within ``min_s`` (e.g. a final state that might be a requeue)."""
        self.next_at = min(self.next_at, self.clock() + self.min_s)

    def polled(self, changed: bool) -> None:
        self.polls += 1
        self.urgent = False
        if changed:
            self.calm_since = self.clock()
        self.next_at = self.clock() + self.interval()


class LogTail:
    """New complete lines of a growing file (survives the file appearing late), read in pieces
    of at most ``chunk`` bytes: following a log that grew by a GiB holds one piece, not the GiB
    (``more`` says a piece is waiting). A line longer than a piece comes in pieces."""

    def __init__(self, path: Path, chunk: int = CHUNK) -> None:
        self.path = path
        self.chunk = chunk
        self.offset = 0
        self.partial = b""
        self.lines = 0  # complete lines returned so far
        self.more = False  # the file holds more than was read

    def read(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.offset:  # truncated (rewritten): from its start again
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read(self.chunk)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            self.more = False
            return []
        self.offset += len(data)
        self.more = self.offset < size
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) >= self.chunk:  # one enormous line: shown in pieces
            lines.append(self.partial)
            self.partial = b""
        self.lines += len(lines)
        return [ln.decode("utf-8", "replace") for ln in lines]

    def flush(self) -> list[str]:
        """The next piece, and the unterminated last line once nothing more waits."""
        rest = self.read()
        if self.partial and not self.more:
            rest.append(self.partial.decode("utf-8", "replace"))
            self.partial = b""
        return rest


class ChainTail(LogTail):
    """Rank ``rank``'s log across the links of a chain (jobs.chain): one link runs at a time, so
    their logs follow each other; at the end of one link's log the next link's is read once it
    exists (the links are read again from run.json then: links queue more links)."""

    def __init__(self, record: RunRecord, rank: int, chunk: int = CHUNK) -> None:
        self.record, self.rank, self.done = record, rank, 0
        super().__init__(record.log_file(record.chain_job_ids[0], rank), chunk)

    def read(self) -> list[str]:
        lines = super().read()
        if lines or self.more or self.partial:
            return lines
        from jobs.errors import RunNotFoundError
        from jobs.records import load_record

        try:
            ids = load_record(self.record.run_dir).chain_job_ids or self.record.chain_job_ids
        except RunNotFoundError:  # a damaged record: the links known so far
            ids = self.record.chain_job_ids
        later = [j for j in ids[self.done + 1 :] if self.record.log_file(j, self.rank).exists()]
        if not later:
            return lines
        self.done = ids.index(later[0])
        self.path, self.offset, self.partial = self.record.log_file(later[0], self.rank), 0, b""
        return super().read()


def _clock_time(hms: str, now: float) -> float:
    """Epoch seconds of today's (or, near midnight, yesterday's) ``HH:MM:SS``."""
    day = time.localtime(now)
    h, m, s = (int(x) for x in hms.split(":"))
    t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, h, m, s, 0, 0, -1))
    return t - 86400 if t > now + 3600 else t


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


@dataclass(order=True)
class Item:
    """One thing to show: a log line, an event or a state change, ordered by time (a final
    state after everything else)."""

    last: bool
    time: float
    seq: int
    text: str = field(compare=False)
    data: dict[str, Any] = field(compare=False)


def describe_event(event: dict[str, Any], run_dir: str | Path) -> str | None:
    """One readable line for an ``events.jsonl`` entry (None: nothing worth a line)."""
    name, step = event.get("event"), event.get("step")
    at = f" at step {step}" if step is not None else ""
    ckpt = ""
    if step is not None:
        # step-N on the first line of the history, step-N.bB on branch B (train.checkpoint)
        root = Path(run_dir) / CHECKPOINTS
        found = [p.name for p in (root / f"step-{step}", *root.glob(f"step-{step}.b*"))]
        saved = [n for n in found if (root / n).is_dir()]
        ckpt = f", checkpoint {saved[-1]}" if saved else ""
    if name == "start":
        return f"started{at}"
    if name == "resume":
        restart = event.get("restart_count")
        return f"resumed{at}" + (f" (restart {restart})" if restart else "")
    if name == "signal":
        return f"stop signal {event.get('signal', '')}{at}".replace("  ", " ")
    if name in ("preempted", "timeout"):
        what = "preempted" if name == "preempted" else "time limit reached"
        return f"{what}{at}{ckpt}"
    if name == "failure":
        return f"failed{at}: {event.get('error', 'unknown error')}"
    hosts = event.get("nodes")  # a list for hang/node_fail (train.schema.EVENT)
    nodes = ",".join(map(str, hosts)) if isinstance(hosts, list) and hosts else "?"
    if name == "hang":
        ranks = ",".join(map(str, event.get("ranks") or [])) or "?"
        return f"hang{at}: rank(s) {ranks} on {nodes} made no progress{ckpt}"
    if name == "node_fail":
        return f"node failure{at}: Slurm failed {nodes} and requeued the job{ckpt}"
    if name == "quarantine":
        kept_off = event.get("nodes")
        if isinstance(kept_off, list) and kept_off:
            return f"{','.join(map(str, kept_off))} excluded after {event.get('reason', 'a fault')}"
        return f"no node excluded: {event.get('skipped', 'not needed')}"
    if name == "requeue":
        by = {"exit_code": " (exit code 75: the launcher restarts it)",
              "batch_script": " (by the batch script, after the step)",
              "local": " (by the local executor)"}.get(str(event.get("via")), "")  # fmt: skip
        if event.get("asked_by") == "command":  # its own `scontrol requeue`, taken by the stop
            by += ", as the command asked"
        return "requeued" + by
    if name == "requeue_failed":
        return f"requeue refused by Slurm: {event.get('error', '?')}"
    if name == "budget_exhausted":
        return f"not requeued: {event.get('reason', 'budget spent')}"
    if name == "cancelled":
        return f"cancelled{at}{ckpt or ''}"
    if name == "complete":
        acc = event.get("test_accuracy")
        acc_text = f", test acc {100 * acc:.1f}%" if isinstance(acc, int | float) else ""
        return f"complete{at}{acc_text}"
    if name == "target":
        return f"target accuracy reached{at}"
    if name == "checkpoint":
        return None  # the log says "checkpoint saved" already
    return f"{name}{at}" if isinstance(name, str) else None


class LineFilter:
    """Shortens train's log lines and drops submitit's duplicates (see module docstring)."""

    def __init__(self) -> None:
        self.shown_submitit: list[str] = []

    def __call__(self, line: str, now: float) -> tuple[float | None, str | None]:
        """(time of the line or None, text to show or None to drop it)."""
        m = _SUBMITIT.match(line)
        if m:
            level, hms, msg = m.groups()
            if level in ("DEBUG", "INFO"):
                return _clock_time(hms, now), None
            self.shown_submitit = [*self.shown_submitit[-20:], msg]
            return _clock_time(hms, now), f"{hms} {level} submitit: {msg}"
        m = _OURS.match(line)
        if m:
            hms, _rank, level, logger, msg = m.groups()
            t = _clock_time(hms, now)
            if logger == "submitit" and (level in ("DEBUG", "INFO") or msg in self.shown_submitit):
                return t, None
            return t, f"{hms} {msg}" if level == "INFO" else f"{hms} {level} {msg}"
        m = _STEPD.match(line.strip())
        if m:  # a preemption, time limit or requeue seen from inside the step: not an error
            why = (m.group(1) or "cancelled").strip().lower()
            return None, f"Slurm ended the step: {why}"
        if _SRUN_TEARDOWN.match(line.strip()):
            return None, None  # srun taking the step down: the events say why
        return None, line


@dataclass
class Following:
    """The per-run state of one :func:`follow` call."""

    record: RunRecord
    rank: int
    ids: list[str]
    tails: dict[str, LogTail] = field(default_factory=dict)
    events: dict[str, LogTail] = field(default_factory=dict)
    filters: dict[str, LineFilter] = field(default_factory=dict)
    last_time: dict[str, float] = field(default_factory=dict)
    final_event: dict[str, bool] = field(default_factory=dict)
    unfit: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # skipped events
    seq: int = 0

    def __post_init__(self) -> None:
        dirs = dict(zip(self.record.job_ids(), self.record.tasks, strict=False))
        for jid in self.ids:
            chain = bool(self.record.chain_job_ids) and jid == self.record.job_id
            tail = ChainTail(self.record, self.rank) if chain else None  # every link's log
            self.tails[jid] = tail or LogTail(self.record.log_file(jid, self.rank))
            self.filters[jid] = LineFilter()
            task = dirs.get(jid)
            if task is not None:
                self.events[jid] = LogTail(Path(task.run_dir) / EVENTS_FILE)

    def behind(self, jid: str) -> bool:
        """A piece of the task's log or events is waiting to be read."""
        events = self.events.get(jid)
        return self.tails[jid].more or (events is not None and events.more)

    def item(self, t: float, text: str, data: dict[str, Any], last: bool = False) -> Item:
        self.seq += 1
        return Item(last, t, self.seq, text, data)

    def read(self, jid: str, *, flush: bool, pretty: bool, hurry: Callable[[], None]) -> list[Item]:
        now = time.time()
        many = len(self.ids) > 1
        prefix = f"[{jid}] " if many else ""
        items = []
        tail = self.tails[jid]
        fresh_log = tail.offset == 0
        lines = tail.flush() if flush else tail.read()
        if lines and fresh_log:
            hurry()  # the job started writing: Slurm has news too
        for line in lines:
            t, text = self.filters[jid](line, now) if pretty else (None, line)
            stamped = t is not None
            # A node's clock may run ahead of ours: never order a line after "now".
            t = min(t, now) if t is not None else self.last_time.get(jid, now)
            self.last_time[jid] = t
            if pretty and text is not None and not stamped and text.strip():
                text = f"{_hms(t)} {text}"  # one prefix style: every line starts with its time
            if text is not None and (text.strip() or not pretty):
                data = {"type": "log", "job_id": jid, "rank": self.rank, "line": line}
                items.append(self.item(t, prefix + text, data))
        events = self.events.get(jid)
        if events is not None:
            run_dir = events.path.parent
            first = events.lines + 1
            lines = events.read()
            checked = check_lines([ln.encode() for ln in lines] + [b""])  # all complete
            unfit = self.unfit.setdefault(jid, [])
            for number, event in checked:
                why = "not a JSON object" if event is None else EVENT.problem(event)
                if why is not None or event is None:  # typed (train.schema): skipped, reported
                    unfit.append((first + number - 1, why or ""))
                    report(events.path, EVENT.kind, unfit)
                    continue
                if event["event"] in _HURRY:
                    hurry()
                self.final_event[jid] = event["event"] in _FINAL_EVENTS
                when = event.get("time")
                t = min(float(when), now) if isinstance(when, int | float) else now
                text = describe_event(event, run_dir)
                if text is not None:
                    data = {"type": "event", "job_id": jid, **event}
                    items.append(self.item(t, f"{_hms(t)} {prefix}>> {text}", data))
        return items


def _state_item(f: Following, info: JobInfo, why: str, final: bool = False) -> Item:
    now = time.time()
    data = {
        "type": "state",
        "time": round(now, 3),
        "job_id": info.job_id,
        "state": info.state,
        "exit_code": info.exit_code,
        "reason": why,
    }
    why_text = f" ({why})" if why else ""
    return f.item(now, f"{_hms(now)} job {info.job_id}: {info.state}{why_text}", data, final)


def follow(
    record: RunRecord,
    client: ClientFactory,
    *,
    rank: int = 0,
    out: IO[str] | None = None,
    poll_s: float = 1.0,
    only: str | None = None,
    show_states: bool = True,
    as_json: bool = False,
    min_poll_s: float = MIN_POLL_S,
    max_poll_s: float = MAX_POLL_S,
) -> int:
    """Stream the run until it ends: state changes, readable events and rank ``rank``'s log
    (``show_states=False``, ``logs -f``: the raw log only). Returns 0 iff every task COMPLETED.

    ``poll_s``: how often the files are read; Slurm is asked on :class:`Poller`'s schedule.
    """
    from jobs.monitor import _finished, outcome, reason, states_many

    stream = out or sys.stdout
    client = functools.cache(client)  # one client for the whole follow (its set-up costs)
    f = Following(record, rank, [only] if only else record.job_ids())
    poller = Poller(min_s=min_poll_s, max_s=max_poll_s)
    pretty = show_states and not as_json
    local = record.executor == "local"
    last: dict[str, str] = {}
    finals_seen: dict[str, int] = {}
    announced: set[str] = set()
    draining: dict[str, JobInfo] = {}  # over, but its files are not read to the end yet
    states: dict[str, JobInfo] = {}
    unknown_since: float | None = None
    held: list[Item] = []  # read, not yet shown (REORDER_S)
    while True:
        items: list[Item] = held
        for jid in f.ids:
            now_state = states.get(jid)
            if jid in announced or (
                now_state is not None and now_state.state == "PENDING" and not f.tails[jid].offset
            ):
                continue  # over, or no log yet (a big array's pending tasks cost no stat)
            items += f.read(jid, flush=False, pretty=pretty, hurry=poller.hurry)
        for jid, info in list(draining.items()):
            if not f.behind(jid):  # read to the end: the final state comes last
                items += f.read(jid, flush=True, pretty=pretty, hurry=lambda: None)
                if show_states:
                    items.append(_state_item(f, info, reason(info), final=True))
                announced.add(jid)
                del draining[jid]
        if local or poller.due():
            found = states_many([record], client, ttl_s=min_poll_s, fresh=poller.urgent)
            states = {k: v for k, v in found.items() if k in f.tails}
            changed = confirm = False
            for jid, info in states.items():
                if jid in announced or jid in draining:
                    continue
                moved = last.get(jid) != info.state
                changed = changed or moved
                last[jid] = info.state
                if not _finished(info):
                    finals_seen[jid] = 0
                    if moved and show_states:
                        items.append(_state_item(f, info, reason(info)))
                    continue
                # A final state right after a stop may be a requeue passing by: believe it
                # when the run's history says it is over, or when the next poll agrees.
                finals_seen[jid] = finals_seen.get(jid, 0) + 1
                if local or f.final_event.get(jid) or finals_seen[jid] >= 2:
                    if f.behind(jid):
                        draining[jid] = info  # announced once its files are read
                        continue
                    items += f.read(jid, flush=True, pretty=pretty, hurry=lambda: None)
                    if show_states:
                        items.append(_state_item(f, info, reason(info), final=True))
                    announced.add(jid)
                else:
                    confirm = True
            if not local:
                poller.polled(changed)
                if confirm:
                    poller.soon()  # within min_s, whatever the back-off had reached
            everything_unknown = bool(states) and all(s.state == "UNKNOWN" for s in states.values())
            unknown_since = (unknown_since or time.monotonic()) if everything_unknown else None
        # In time order, a state line after the lines before it. What was read in the last
        # REORDER_S waits for the next round (a record written a moment late comes first);
        # everything goes out once a task is over.
        everything = bool(states) and announced >= set(states)
        # reading a backlog (a piece of a file waits), nothing is held: one piece at a time
        everything = everything or any(f.behind(j) for j in f.ids) or len(items) > 10_000
        cut = time.time() - REORDER_S
        ready = [it for it in items if everything or it.last or it.time <= cut]
        held = [it for it in items if not (everything or it.last or it.time <= cut)]
        if any(it.last for it in ready):
            ready, held = items, []
        for it in sorted(ready):
            stream.write((json.dumps(it.data, default=str) if as_json else it.text) + "\n")
        stream.flush()
        del items, ready  # one piece of each file at a time, never the whole backlog
        if states and announced >= set(states):
            return outcome(states)
        if unknown_since is not None and time.monotonic() - unknown_since > UNKNOWN_GIVE_UP_S:
            msg = f"jobs: Slurm does not know {', '.join(states)} (purged?); giving up"
            stream.write(json.dumps({"type": "error", "message": msg}) if as_json else msg)
            stream.write("\n")
            stream.flush()
            return 1
        if not any(f.behind(j) for j in f.ids if j not in announced):
            time.sleep(poll_s)  # caught up; a backlog is read on at once
