"""The goodput ledger: where every second of a run's wall time went (pure, torch-free).

Wall time runs from the submission (Slurm's ``Submit`` of the first attempt, else ``run.json``'s
``submitted_at``) to the end (Slurm's ``End`` of the last attempt, else the last event of a
finished run, else now). It is cut into consecutive intervals, so the parts add up to the wall
time exactly; an interval nothing recorded is ``unaccounted``, never guessed:

========== ================================================================================
part       from what
========== ================================================================================
queued     the first queue wait: Submit -> Start of the first attempt (``sacct -D``); a
           task still pending (its state, from ``jobs status``'s one query) up to now
held       a requeue's hold and queue wait: a later attempt's Submit -> Start (the hold
           until ``BeginTime`` included); without Slurm's times (a local run), a recorded
           stop -> the next process start
links      a chain of jobs (jobs.chain): the wait between links, the previous link's end ->
           the next link's Start (each link is one attempt here, in the order they ran)
startup    Slurm's Start (else the process start: the start/resume event minus its
           ``startup`` phases, :mod:`train.startup`) -> the ``start``/``resume`` event (the
           first step comes right after it)
productive the rest of the training window (start/resume -> the ``signal`` event, where
           the ranks stopped training, else the stop event, or ``complete``)
eval       ``eval`` metrics lines' ``seconds`` inside the window
checkpoint ``train`` metrics lines' ``checkpoint_s`` inside the window (interval saves)
redone     steps trained in this segment beyond the step the next one resumed from, times
           the segment's mean step time (work lost since the last checkpoint)
hang       a ``hang`` stop: the last progress -> the hang event. The last progress is what
           the hang watcher saw (its ``observed`` ranks' ``idle_s``: the built-in trainer's
           last step, a command's last write to its output or files), else the last
           ``train`` metrics line carried forward to the hung step at the mean step time
           (a command's own reports included), never later than the event less its
           ``timeout_s`` (a hang is declared after that much silence)
stop       training stopped (or ended) -> the process left (the save at the stop, the
           requeue): Slurm's ``End`` of the attempt, the next in-place restart's process
           start, else the segment's last event; an attempt that recorded no end but whose
           node failure the next attempt recorded (``late``): its last step -> Slurm's End
========== ================================================================================

An expedited requeue (25.11+: a job submitted with ``--requeue=expedite`` and requeued after
a node failure starts again at once, at top priority) is listed apart (``expedited``): the
attempt it started, the wait it had (its Submit -> Start, counted in ``held``) and the hold a
plain requeue waits on that cluster (``requeue_delay``, else ``cred_expire``: recorded at
submission), the difference being the wait it saved. It moves no second between the parts.

Every part is clamped: the cursor never moves past the end of the run, a part never goes
negative, and a foreign or damaged value (a negative ``seconds``, a ``checkpoint_s`` that is
not a number, a time that is not finite or lies after the end) cannot make the parts exceed
the wall time: for any records, the parts add up to ``end - origin`` (0 when the end is before
the origin).

A record stamped before the submission (a node whose clock is behind the controller's) counts
from the cursor on (the interval is never booked twice, never backwards); the ``notes`` name
the skew.

A *segment* is one process run: it opens with a ``start``/``resume`` event. A
``restart_in_place`` (a failure or hang restarted inside the same allocation) ends a segment
like a stop; the next segment opens in the same Slurm attempt. Without Slurm's times (a local
run, sacct unreachable) the gaps between segments are ``unaccounted``.

A command entrypoint records no steps. Its start-up runs from the supervisor's start event to
the command's first output (``first_output_at``, on rank 0's supervisor's later events of the
same process run: when it saw the command's processes write, to a file, a pipe or a socket, for
the first time, within 0.2 s): its imports count as start-up, the rest of its window as
productive, its own set-up after that first write and any redone steps included (the ledger's
``notes`` say so). A segment without it (a silent command, a run recorded before this field,
a process killed before it recorded anything) counts from its start event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from train.runfiles import events_where

__all__ = ["LABELS", "PARTS", "Attempt", "Expedited", "Ledger", "compute", "sum_ledgers"]

PARTS = (
    "productive",
    "eval",
    "checkpoint",
    "startup",
    "redone",
    "hang",
    "stop",
    "queued",
    "held",
    "links",
    "unaccounted",
)
LABELS = {
    "productive": "productive training",
    "eval": "evaluation",
    "checkpoint": "checkpoint saves",
    "startup": "start-up",
    "redone": "steps redone",
    "hang": "undetected hangs",
    "stop": "stop overhead",
    "queued": "first queue wait",
    "held": "requeue holds",
    "links": "waits between links",
    "unaccounted": "unaccounted",
}
# events that end a segment (the process stops training), and those that end the run
_ENDS = events_where(ends_segment=True)
_TERMINAL = events_where(final=True)
# Slurm states of a task that is over (no attempt will follow)
_OVER = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "BOOT_FAIL", "DEADLINE", "REVOKED")  # fmt: skip
#: a run this short is mostly start-up whatever it does: its line says so
SHORT_RUN_S = 120.0


class Attempt(Protocol):
    """One Slurm attempt's times (:class:`cluster.models.JobAttempt`)."""

    @property
    def submit(self) -> float | None: ...
    @property
    def start(self) -> float | None: ...
    @property
    def end(self) -> float | None: ...


@dataclass(frozen=True)
class Expedited:
    """One expedited requeue: attempt ``attempt`` (its restart count) started ``waited_s``
    after the requeue, where a plain requeue is held ``hold_s``."""

    attempt: int
    waited_s: float
    hold_s: float

    @property
    def saved_s(self) -> float:
        return max(0.0, self.hold_s - self.waited_s)

    def line(self) -> str:
        return (
            f"expedited requeue: attempt {self.attempt} started {self.waited_s:.0f} s after a "
            f"node failure's requeue, where a plain requeue is held {self.hold_s:.0f} s "
            f"(saved {self.saved_s:.0f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "waited_s": round(self.waited_s, 3),
            "hold_s": round(self.hold_s, 3),
            "saved_s": round(self.saved_s, 3),
        }


@dataclass
class Ledger:
    """Seconds per part (:data:`PARTS`); ``wall_s`` is their sum."""

    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    steps_redone: int = 0
    stops: int = 0
    notes: list[str] = field(default_factory=list)
    # a sweep's ledger (sum_ledgers): how many tasks, and the sweep's own span (its first
    # task's origin -> its last task's end); a single run: 1 task, its wall time
    tasks: int = 1
    origin: float | None = None
    end: float | None = None
    # expedited requeues after a node failure: the attempt they started, its wait, the hold
    # a plain requeue would have waited (compute's ``expedited_hold_s``)
    expedited: list[Expedited] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return sum(self.parts.values())

    @property
    def goodput(self) -> float | None:
        wall = self.wall_s
        return self.parts["productive"] / wall if wall > 0 else None

    def biggest_loss(self) -> tuple[str, float] | None:
        losses = [(k, v) for k, v in self.parts.items() if k != "productive" and v > 0]
        return max(losses, key=lambda kv: kv[1]) if losses else None

    @property
    def span_s(self) -> float:
        """The run's own span (a sweep: its first submission -> its last end), not the sum of
        its tasks' times."""
        if self.origin is None or self.end is None:
            return self.wall_s
        return max(0.0, self.end - self.origin)

    def line(self) -> str:
        """``goodput 0.91 (biggest loss: requeue holds 41 s)``; a sweep says over how many
        tasks and its real span; a short run says it is mostly start-up. Empty without wall
        time."""
        g = self.goodput
        if g is None:
            return ""
        loss = self.biggest_loss()
        said = [f"biggest loss: {LABELS[loss[0]]} {loss[1]:.0f} s"] if loss else []
        span, fixed = self.span_s, self.parts["startup"] + self.parts["queued"]
        if 0 < span < SHORT_RUN_S and fixed >= 0.25 * self.wall_s:
            said.append(f"a {_secs(span)} run: its start-up and first queue wait weigh more "
                        "than in a long run")  # fmt: skip
        head = f"goodput {g:.2f}"
        if self.tasks > 1:
            head += f" over {self.tasks} tasks ({_secs(self.wall_s)} of task time in {_secs(span)})"
        return head + (f" ({'; '.join(said)})" if said else "")

    def to_dict(self) -> dict[str, Any]:
        g = self.goodput
        return {
            "goodput": None if g is None else round(g, 4),
            "wall_s": round(self.wall_s, 3),
            "parts_s": {k: round(v, 3) for k, v in self.parts.items()},
            "steps_redone": self.steps_redone,
            "stops": self.stops,
            "notes": list(self.notes),
            "tasks": self.tasks,
            "span_s": round(self.span_s, 3),
            "expedited_requeues": [e.to_dict() for e in self.expedited],
            "expedite_saved_s": round(sum(e.saved_s for e in self.expedited), 3),
        }


def _secs(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def sum_ledgers(ledgers: Iterable[Ledger]) -> Ledger:
    """A sweep's ledger: every task's parts summed (task time), its span the sweep's own (its
    earliest origin -> its latest end)."""
    total = Ledger(tasks=0)
    for led in ledgers:
        for k, v in led.parts.items():
            total.parts[k] = total.parts.get(k, 0.0) + v
        total.steps_redone += led.steps_redone
        total.stops += led.stops
        total.tasks += led.tasks
        total.notes.extend(n for n in led.notes if n not in total.notes)
        total.expedited.extend(led.expedited)
        if led.origin is not None:
            total.origin = led.origin if total.origin is None else min(total.origin, led.origin)
        if led.end is not None:
            total.end = led.end if total.end is None else max(total.end, led.end)
    total.tasks = max(total.tasks, 1)
    return total


def _num(value: Any) -> float | None:
    """A finite number, else None (a foreign record's string, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _dur(value: Any) -> float:
    """A duration a record claims: a finite number >= 0, else 0."""
    number = _num(value)
    return number if number is not None and number > 0 else 0.0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class _Segment:
    opened: Mapping[str, Any]
    events: list[Mapping[str, Any]] = field(default_factory=list)
    # an end recorded afterwards, by the next attempt (a node failure that took rank 0 with
    # it: ``late: true``): it says how the segment ended, not when
    explained: Mapping[str, Any] | None = None

    @property
    def time(self) -> float:
        return float(self.opened["time"])

    @property
    def restart(self) -> int | None:
        return _int(self.opened.get("restart_count"))

    @property
    def step(self) -> int | None:
        return _int(self.opened.get("step"))

    @property
    def sluid(self) -> str:
        value = self.opened.get("sluid")
        return value if isinstance(value, str) else ""

    def training_from(self) -> float:
        """When training began: the start/resume event, or for a command (which records no
        steps) its first output in this segment."""
        if self.step is None:
            for e in self.events:
                at = _num(e.get("first_output_at"))
                if at is not None and at >= self.time:
                    return at
        return self.time

    def process_start(self) -> float | None:
        phases = self.opened.get("startup")
        if not isinstance(phases, Mapping):
            return None
        seconds = [v for v in (_num(x) for x in phases.values()) if v is not None and v >= 0]
        return self.time - sum(seconds) if seconds else None

    def stop(self) -> tuple[float | None, Mapping[str, Any] | None]:
        """When training stopped (the ``signal`` event: the ranks agreed to stop there; the
        steps between its ``received_at`` and then were trained and saved), else the ending
        event's time, and the ending event (None: the segment has no record of its end)."""
        signal_at: float | None = None
        for e in self.events:
            if e.get("event") == "signal" and signal_at is None:
                signal_at = _num(e.get("time"))
            if e.get("event") in _ENDS:
                return (signal_at if signal_at is not None else float(e["time"])), e
        return signal_at, None

    def last_event_time(self) -> float:
        return max([self.time, *(float(e["time"]) for e in self.events)])


class _Cursor:
    """Walks the wall time forward, never past ``end``; every interval goes to exactly one
    part, so the parts add up to ``end - origin`` whatever the records say."""

    def __init__(self, ledger: Ledger, at: float, end: float) -> None:
        self.ledger, self.at, self.end = ledger, at, max(at, end)

    def to(self, part: str, until: float | None) -> None:
        if until is None or not math.isfinite(until):
            return
        until = min(until, self.end)
        if until <= self.at:
            return
        self.ledger.parts[part] += until - self.at
        self.at = until

    def spend(self, part: str, seconds: float, limit: float) -> None:
        """``seconds`` of ``part``, at most up to ``limit`` (and the end)."""
        if seconds > 0:
            self.to(part, self.at + min(seconds, max(0.0, limit - self.at)))


def _timed(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = [r for r in records if isinstance(r, Mapping) and _num(r.get("time")) is not None]
    out.sort(key=lambda r: float(r["time"]))
    return out


def _segments(events: Sequence[Mapping[str, Any]]) -> list[_Segment]:
    segments: list[_Segment] = []
    late = []
    for e in _timed(events):
        if e.get("late") is True:
            late.append(e)  # written at a later start: it belongs to its own attempt
        elif e.get("event") in ("start", "resume"):
            segments.append(_Segment(e))
        elif segments:
            segments[-1].events.append(e)
    for e in late:
        restart = _int(e.get("restart_count"))
        own = [seg for seg in segments if restart is not None and seg.restart == restart]
        if own and own[-1].explained is None:
            own[-1].explained = e
    return segments


@dataclass(frozen=True)
class _Times:
    """An attempt's times, each finite or None."""

    submit: float | None
    start: float | None
    end: float | None
    sluid: str = ""  # Slurm's name of the run (24.11+), "" where none

    @classmethod
    def of(cls, attempt: Attempt) -> _Times:
        # a source without SLUIDs (22.05, a stand-in) has no such attribute
        sluid = getattr(attempt, "sluid", "")
        return cls(
            _num(attempt.submit),
            _num(attempt.start),
            _num(attempt.end),
            sluid if isinstance(sluid, str) else "",
        )


def compute(
    events: Sequence[Mapping[str, Any]],
    metrics: Sequence[Mapping[str, Any]],
    attempts: Sequence[Attempt] = (),
    *,
    submitted_at: float | None = None,
    now: float,
    state: str | None = None,
    slurm: bool = True,
    chain: bool = False,
    expedited_hold_s: float | None = None,
) -> Ledger:
    """The ledger of one run (one task of a sweep) from its records (pure).

    ``events``/``metrics``: ``events.jsonl``/``metrics.jsonl`` objects; ``attempts``: Slurm's
    attempts of the job, oldest first (attempt k is restart_count k; keyed by SLUID instead
    where the start events and sacct both name one: 24.11+); ``now``: the end of a
    run still going. ``state``: the task's Slurm state when the caller knows it (a PENDING
    task's time is its queue wait; a task that is over ends at its last record, not now).
    ``slurm``: False for a run without Slurm (the local executor): its launcher's start is
    start-up, the wait between a recorded stop and the next start a requeue hold. ``chain``:
    the attempts are the links of a chain (their events' ``restart_count`` the link's place):
    a later attempt's wait is ``links``. ``expedited_hold_s``: the run asked for an expedited
    requeue (``--requeue=expedite``) where a plain requeue is held that long: each attempt
    that followed a node failure is listed in ``Ledger.expedited``.
    """
    later = "links" if chain else "held"
    ledger = Ledger()
    segments = _segments(events)
    timed_metrics = _timed(metrics)
    times = [_Times.of(a) for a in attempts]
    first_submit = times[0].submit if times else None
    origin = first_submit if first_submit is not None else _num(submitted_at)
    if origin is None:
        if not segments:
            return ledger
        origin = segments[0].process_start() or segments[0].time
    clock = _num(now)
    end = _end_of_run(segments, times, origin if clock is None else clock, state, timed_metrics)
    cursor = _Cursor(ledger, origin, end)
    ledger.origin, ledger.end = origin, cursor.end
    end = cursor.end
    earliest = min([*(s.process_start() or s.time for s in segments)], default=origin)
    if earliest < origin - 1.0:
        ledger.notes.append(
            f"records stamped {origin - earliest:.0f} s before the submission (a node's clock "
            "behind the controller's): counted from the submission"
        )
    if not segments:
        over = state in _OVER
        ledger.notes.append(
            f"never started ({state} while queued)"
            if over and not times
            else "no start recorded yet"
        )
    seen_restarts: set[int] = set()
    stopped_at: Mapping[str, Any] | None = None  # the previous segment's recorded stop
    for i, seg in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        attempt = _attempt(times, seg.restart, seg.sluid)
        first_of_attempt = seg.restart is None or seg.restart not in seen_restarts
        if seg.restart is not None:
            seen_restarts.add(seg.restart)
        # -- before training: queued (the first wait) or held (a requeue's), then the start-up
        if first_of_attempt and attempt is not None and attempt.start is not None:
            waited = "queued" if times and attempt is times[0] else later
            cursor.to(waited, min(attempt.start, seg.time))
        else:
            proc = seg.process_start()
            if not first_of_attempt:
                gap = "stop"  # an in-place restart: the stop runs to the next process start
            elif not slurm and i == 0:
                gap = "startup"  # the local launcher's own start
            elif not slurm and stopped_at is not None:
                gap = "held"  # the local launcher restarts a stopped run
            else:
                gap = "unaccounted"
            cursor.to(gap, proc)
            if proc is None and not first_of_attempt:
                ledger.notes.append("an in-place restart without start-up phases")
        cursor.to("startup", seg.time)
        # -- a command's own start-up (its imports), up to its first output
        stop_at, ending = seg.stop()
        stopped_at = ending
        cursor.to("startup", min(seg.training_from(), stop_at if stop_at is not None else end))
        # -- training, until the stop
        if ending is None and nxt is None and not _terminal(segments):
            stop_at = end if stop_at is None else stop_at  # still training (or stopping) now
        if stop_at is None:  # ended without a record: its last step is the last we know
            lines = [m for m in timed_metrics if seg.time <= float(m["time"]) < _next_t(nxt)]
            stop_at = float(lines[-1]["time"]) if lines else seg.time
            if seg.explained is None:
                ledger.notes.append(f"attempt {seg.restart}: no stop recorded (unaccounted)")
        stop_at = min(max(stop_at, cursor.at), end)
        _training(ledger, cursor, seg, nxt, stop_at, ending, timed_metrics)
        # -- the stop: signal (or end) -> the process left
        last_of_attempt = nxt is None or nxt.restart != seg.restart
        left = attempt.end if last_of_attempt and attempt is not None else None
        if left is not None:  # sacct's End is a whole second: never before our last record
            left = max(left, seg.last_event_time())
        if ending is not None and ending.get("event") != "complete":
            ledger.stops += 1
        if ending is None and nxt is None and seg.stop()[0] is not None:
            cursor.to("stop", end)  # a signal arrived: stopping now
        elif ending is None and seg.explained is not None and left is not None:
            # its end is known (a node failure, from Slurm's account), its time is not: the
            # last step seen -> Slurm's End is what the failure cost (and its detection)
            ledger.stops += 1
            cursor.to("stop", left)
            ledger.notes.append(
                f"attempt {seg.restart}: ended by a {seg.explained.get('event')} recorded at "
                "the next start: its last step -> Slurm's end counts as stop"
            )
        elif ending is None:
            cursor.to("unaccounted", left)
        elif left is not None:
            cursor.to("stop", left)
        elif last_of_attempt:
            cursor.to("stop", seg.last_event_time())
        # (an in-place restart: the stop runs to the next process start, above)
        if expedited_hold_s is not None and last_of_attempt:
            _note_expedite(ledger, seg, ending, nxt, times, expedited_hold_s)
    # Slurm attempts after the last segment: held, queued, or starting now
    last_restart = segments[-1].restart if segments else -1
    for k, times_k in enumerate(times):
        if last_restart is not None and k <= last_restart:
            continue
        cursor.to(
            "queued" if k == 0 else later, times_k.start if times_k.start is not None else end
        )
        if times_k.start is not None and times_k.end is None:
            cursor.to("startup", end)  # starting now
        elif times_k.start is not None and times_k.end is not None:  # ran, wrote nothing
            cursor.to("unaccounted", times_k.end)
            ledger.notes.append(f"attempt {k}: ran without a start record (unaccounted)")
    if not segments and state == "PENDING":
        cursor.to("queued", end)  # not started yet: its first queue wait so far
    cursor.to("unaccounted", end)
    if any(seg.step is None for seg in segments):
        ledger.notes.append(
            "a command records no steps: its start-up counts until its first output, the rest "
            "until the stop as productive (its set-up after that output and any redone steps "
            "included)"
        )
    return ledger


def _note_expedite(
    ledger: Ledger,
    seg: _Segment,
    ending: Mapping[str, Any] | None,
    nxt: _Segment | None,
    times: Sequence[_Times],
    hold_s: float,
) -> None:
    """An attempt ended by a node failure (its own record, else the one the next attempt
    wrote) and requeued expedited: the next attempt's wait beside the hold it skipped."""
    why = ending if ending is not None else seg.explained
    if why is None or why.get("event") != "node_fail" or seg.restart is None:
        return
    if nxt is not None and nxt.restart is not None and nxt.restart > seg.restart:
        after, restart = _attempt(times, nxt.restart, nxt.sluid), nxt.restart
    else:
        after, restart = _attempt(times, seg.restart + 1), seg.restart + 1
    if after is None or after.start is None or after.submit is None:
        return  # not started again yet (or Slurm's times unknown): nothing to compare
    waited = max(0.0, after.start - after.submit)
    ledger.expedited.append(Expedited(restart, waited, max(0.0, _dur(hold_s))))


def _next_t(seg: _Segment | None) -> float:
    return seg.time if seg is not None else float("inf")


def _attempt(attempts: Sequence[_Times], restart: int | None, sluid: str = "") -> _Times | None:
    """The Slurm attempt a segment ran in: the one of its SLUID where both have one (24.11+:
    whatever rows accounting kept of the others), else the restart_count-th."""
    if sluid:
        named = [a for a in attempts if a.sluid == sluid]
        if named:
            return named[0]
    if restart is None:
        return attempts[-1] if attempts else None
    return attempts[restart] if 0 <= restart < len(attempts) else None


def _terminal(segments: Sequence[_Segment]) -> bool:
    return bool(segments) and any(e.get("event") in _TERMINAL for e in segments[-1].events)


def _end_of_run(
    segments: Sequence[_Segment],
    attempts: Sequence[_Times],
    now: float,
    state: str | None,
    metrics: Sequence[Mapping[str, Any]],
) -> float:
    """Slurm's End of the last attempt; else a finished run's last event (never after now);
    else, for a task Slurm says is over, its last record (a task that never started: no time
    at all); else now."""
    if attempts and attempts[-1].end is not None:
        return max(attempts[-1].end, 0.0)
    if _terminal(segments):
        return min(segments[-1].last_event_time(), now)
    if state in _OVER:
        last = [s.last_event_time() for s in segments[-1:]]
        last += [float(m["time"]) for m in metrics[-1:]]
        last += [t for a in attempts for t in (a.submit, a.start) if t is not None]
        return min(max(last), now) if last else float("-inf")
    return now


def _hang_from(
    ending: Mapping[str, Any], lines: Sequence[Mapping[str, Any]], begin: float
) -> float:
    """When the hung run last progressed: what the watcher saw (``observed`` ranks' silence,
    the longest: the first rank that stopped), else the last ``train`` line carried forward to
    the hung step at the window's mean step time; never later than the hang event less its
    ``timeout_s``; without any of these, the window's start."""
    at = float(ending["time"])
    timeout = _dur(ending.get("timeout_s"))
    observed = ending.get("observed")
    silences = [
        _dur(o.get("idle_s")) for o in (observed if isinstance(observed, list) else [])
        if isinstance(o, Mapping)
    ]  # fmt: skip
    if any(silences):
        return at - max(silences)
    latest = at - timeout if timeout else at
    train = [(float(m["time"]), _int(m.get("step"))) for m in lines if m.get("kind") == "train"]
    if train:
        t_last, s_last = train[-1]
        hung = _int(ending.get("step"))
        stepped = [(t, s) for t, s in train if s is not None]
        if hung is not None and s_last is not None and hung > s_last and len(stepped) > 1:
            (t0, s0), (t1, s1) = stepped[0], stepped[-1]
            if s1 > s0 and t1 > t0:
                t_last += (hung - s_last) * (t1 - t0) / (s1 - s0)
        return min(t_last, latest)
    return latest if timeout else begin


def _training(
    ledger: Ledger,
    cursor: _Cursor,
    seg: _Segment,
    nxt: _Segment | None,
    stop_at: float,
    ending: Mapping[str, Any] | None,
    metrics: Sequence[Mapping[str, Any]],
) -> None:
    """Split the window [cursor, stop_at) into eval, checkpoint, hang, redone, productive.
    Each part is clamped to what the window has left: a foreign ``seconds`` or
    ``checkpoint_s`` (negative, not a number, larger than the window) cannot overrun it."""
    begin = cursor.at
    window = max(0.0, stop_at - begin)
    inside = [m for m in metrics if begin < float(m["time"]) <= stop_at]
    evals = sum(_dur(m.get("seconds")) for m in inside if m.get("kind") == "eval")
    saves = sum(_dur(m.get("checkpoint_s")) for m in inside if m.get("kind") == "train")
    evals = min(evals, window)
    saves = min(saves, window - evals)
    steps = [s for s in (_int(m.get("step")) for m in inside if m.get("kind") == "train") if s]
    hang = 0.0
    if ending is not None and ending.get("event") == "hang":
        since = min(max(_hang_from(ending, inside, begin), begin), float(ending["time"]))
        hang = min(max(0.0, float(ending["time"]) - since), window - evals - saves)
    train_s = max(0.0, window - evals - saves - hang)
    redone_s = 0.0
    last_step = max(steps) if steps else None
    if ending is not None and _int(ending.get("step")) is not None:
        last_step = max(last_step or 0, int(ending["step"]))
    if last_step is not None and seg.step is not None and nxt is not None and nxt.step is not None:
        done, redo = last_step - seg.step, last_step - nxt.step
        if done > 0 and redo > 0:
            redo = min(redo, done)
            ledger.steps_redone += redo
            redone_s = train_s * redo / done
    for part, seconds in (("eval", evals), ("checkpoint", saves), ("hang", hang),
                          ("redone", redone_s)):  # fmt: skip
        cursor.spend(part, seconds, stop_at)
    cursor.to("productive", stop_at)
