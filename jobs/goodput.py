"""The goodput ledger: where every second of a run's wall time went (pure, torch-free).

Wall time runs from the submission (Slurm's ``Submit`` of the first attempt, else ``run.json``'s
``submitted_at``) to the end (Slurm's ``End`` of the last attempt, else the last event of a
finished run, else now). It is cut into consecutive intervals, so the parts add up to the wall
time exactly; an interval nothing recorded is ``unaccounted``, never guessed:

========== ================================================================================
part       from what
========== ================================================================================
queued     Slurm held or queued the job: Submit -> Start of each attempt (pending, the
           requeue hold until ``BeginTime``), from ``sacct -D``
startup    Slurm's Start (else the process start: the start/resume event minus its
           ``startup`` phases, :mod:`train.startup`) -> the ``start``/``resume`` event (the
           first step comes right after it)
productive the rest of the training window (start/resume -> the ``signal`` event, where
           the ranks stopped training, else the stop event, or ``complete``)
eval       ``eval`` metrics lines' ``seconds`` inside the window
checkpoint ``train`` metrics lines' ``checkpoint_s`` inside the window (interval saves)
redone     steps trained in this segment beyond the step the next one resumed from, times
           the segment's mean step time (work lost since the last checkpoint)
hang       a ``hang`` stop: the last metrics line (the last step seen) -> the hang event
stop       training stopped (or ended) -> the process left (the save at the stop, the
           requeue): Slurm's ``End`` of the attempt, the next in-place restart's process
           start, else the segment's last event; an attempt that recorded no end but whose
           node failure the next attempt recorded (``late``): its last step -> Slurm's End
========== ================================================================================

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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from train.runfiles import events_where

__all__ = ["LABELS", "PARTS", "Attempt", "Ledger", "compute", "sum_ledgers"]

PARTS = (
    "productive",
    "eval",
    "checkpoint",
    "startup",
    "redone",
    "hang",
    "stop",
    "queued",
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
    "queued": "requeue holds",
    "unaccounted": "unaccounted",
}
# events that end a segment (the process stops training), and those that end the run
_ENDS = events_where(ends_segment=True)
_TERMINAL = events_where(final=True)


class Attempt(Protocol):
    """One Slurm attempt's times (:class:`cluster.models.JobAttempt`)."""

    @property
    def submit(self) -> float | None: ...
    @property
    def start(self) -> float | None: ...
    @property
    def end(self) -> float | None: ...


@dataclass
class Ledger:
    """Seconds per part (:data:`PARTS`); ``wall_s`` is their sum."""

    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    steps_redone: int = 0
    stops: int = 0
    notes: list[str] = field(default_factory=list)

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

    def line(self) -> str:
        """``goodput 0.91 (biggest loss: requeue holds 41 s)``; empty without wall time."""
        g = self.goodput
        if g is None:
            return ""
        loss = self.biggest_loss()
        tail = f" (biggest loss: {LABELS[loss[0]]} {loss[1]:.0f} s)" if loss else ""
        return f"goodput {g:.2f}{tail}"

    def to_dict(self) -> dict[str, Any]:
        g = self.goodput
        return {
            "goodput": None if g is None else round(g, 4),
            "wall_s": round(self.wall_s, 3),
            "parts_s": {k: round(v, 3) for k, v in self.parts.items()},
            "steps_redone": self.steps_redone,
            "stops": self.stops,
            "notes": list(self.notes),
        }


def sum_ledgers(ledgers: Iterable[Ledger]) -> Ledger:
    """A sweep's ledger: every task's parts summed."""
    total = Ledger()
    for led in ledgers:
        for k, v in led.parts.items():
            total.parts[k] = total.parts.get(k, 0.0) + v
        total.steps_redone += led.steps_redone
        total.stops += led.stops
        total.notes.extend(n for n in led.notes if n not in total.notes)
    return total


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


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
    """Walks the wall time forward; every interval goes to exactly one part."""

    def __init__(self, ledger: Ledger, at: float) -> None:
        self.ledger, self.at = ledger, at

    def to(self, part: str, until: float | None) -> None:
        if until is None or until <= self.at:
            return
        self.ledger.parts[part] += until - self.at
        self.at = until

    def spend(self, part: str, seconds: float) -> None:
        if seconds > 0:
            self.ledger.parts[part] += seconds
            self.at += seconds


def _timed(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = [r for r in records if _num(r.get("time")) is not None]
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


def compute(
    events: Sequence[Mapping[str, Any]],
    metrics: Sequence[Mapping[str, Any]],
    attempts: Sequence[Attempt] = (),
    *,
    submitted_at: float | None = None,
    now: float,
) -> Ledger:
    """The ledger of one run (one task of a sweep) from its records (pure).

    ``events``/``metrics``: ``events.jsonl``/``metrics.jsonl`` objects; ``attempts``: Slurm's
    attempts of the job, oldest first (attempt k is restart_count k); ``now``: the end of a
    run still going.
    """
    ledger = Ledger()
    segments = _segments(events)
    timed_metrics = _timed(metrics)
    first_submit = attempts[0].submit if attempts else None
    origin = first_submit if first_submit is not None else submitted_at
    if origin is None:
        if not segments:
            return ledger
        origin = segments[0].process_start() or segments[0].time
    cursor = _Cursor(ledger, origin)
    end = _end_of_run(segments, attempts, now)
    if not segments:
        ledger.notes.append("no start recorded yet")
    seen_restarts: set[int] = set()
    for i, seg in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        attempt = _attempt(attempts, seg.restart)
        first_of_attempt = seg.restart is None or seg.restart not in seen_restarts
        if seg.restart is not None:
            seen_restarts.add(seg.restart)
        # -- before training: held or queued by Slurm, then the start-up
        if first_of_attempt and attempt is not None and attempt.start is not None:
            cursor.to("queued", min(attempt.start, seg.time))
        else:
            proc = seg.process_start()
            cursor.to("stop" if not first_of_attempt else "unaccounted", proc)
            if proc is None and not first_of_attempt:
                ledger.notes.append("an in-place restart without start-up phases")
        cursor.to("startup", seg.time)
        # -- a command's own start-up (its imports), up to its first output
        stop_at, ending = seg.stop()
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
            cursor.to("stop", min(left, end))
            ledger.notes.append(
                f"attempt {seg.restart}: ended by a {seg.explained.get('event')} recorded at "
                "the next start: its last step -> Slurm's end counts as stop"
            )
        elif ending is None:
            cursor.to("unaccounted", None if left is None else min(left, end))
        elif left is not None:
            cursor.to("stop", min(left, end))
        elif last_of_attempt:
            cursor.to("stop", min(seg.last_event_time(), end))
        # (an in-place restart: the stop runs to the next process start, above)
    # Slurm attempts after the last segment: held, queued, or starting now
    last_restart = segments[-1].restart if segments else -1
    for k, attempt in enumerate(attempts):
        if last_restart is not None and k <= last_restart:
            continue
        cursor.to("queued", min(attempt.start if attempt.start is not None else end, end))
        ended = attempt.end
        if attempt.start is not None and ended is None:
            cursor.to("startup", end)  # starting now
        elif attempt.start is not None and ended is not None:  # it ran, ended, wrote nothing
            cursor.to("unaccounted", min(ended, end))
            ledger.notes.append(f"attempt {k}: ran without a start record (unaccounted)")
    cursor.to("unaccounted", end)
    if any(seg.step is None for seg in segments):
        ledger.notes.append(
            "a command records no steps: its start-up counts until its first output, the rest "
            "until the stop as productive (its set-up after that output and any redone steps "
            "included)"
        )
    return ledger


def _next_t(seg: _Segment | None) -> float:
    return seg.time if seg is not None else float("inf")


def _attempt(attempts: Sequence[Attempt], restart: int | None) -> Attempt | None:
    if restart is None:
        return attempts[-1] if attempts else None
    return attempts[restart] if 0 <= restart < len(attempts) else None


def _terminal(segments: Sequence[_Segment]) -> bool:
    return bool(segments) and any(e.get("event") in _TERMINAL for e in segments[-1].events)


def _end_of_run(segments: Sequence[_Segment], attempts: Sequence[Attempt], now: float) -> float:
    if attempts and attempts[-1].end is not None:
        return max(float(attempts[-1].end), 0.0)
    if _terminal(segments):
        return segments[-1].last_event_time()
    return now


def _training(
    ledger: Ledger,
    cursor: _Cursor,
    seg: _Segment,
    nxt: _Segment | None,
    stop_at: float,
    ending: Mapping[str, Any] | None,
    metrics: Sequence[Mapping[str, Any]],
) -> None:
    """Split the window [cursor, stop_at) into eval, checkpoint, hang, redone, productive."""
    begin = cursor.at
    window = max(0.0, stop_at - begin)
    inside = [m for m in metrics if begin < float(m["time"]) <= stop_at]
    evals = sum(_num(m.get("seconds")) or 0.0 for m in inside if m.get("kind") == "eval")
    saves = sum(_num(m.get("checkpoint_s")) or 0.0 for m in inside if m.get("kind") == "train")
    evals = min(evals, window)
    saves = min(saves, window - evals)
    steps = [s for s in (_int(m.get("step")) for m in inside if m.get("kind") == "train") if s]
    hang = 0.0
    if ending is not None and ending.get("event") == "hang":
        last = [float(m["time"]) for m in inside if m.get("kind") == "train"]
        since = last[-1] if last else begin
        hang = min(max(0.0, float(ending["time"]) - since), window - evals - saves)
    train_s = window - evals - saves - hang
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
    cursor.spend("eval", evals)
    cursor.spend("checkpoint", saves)
    cursor.spend("hang", hang)
    cursor.spend("redone", redone_s)
    cursor.to("productive", stop_at)
