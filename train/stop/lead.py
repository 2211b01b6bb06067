"""The warning fits the save: how long a stop takes from the signal to a saved checkpoint, and
whether the time Slurm gives covers it (torch-free, stdlib only).

Every stop's ``checkpoint`` event carries ``since_signal_s``: seconds from the stop signal to the
checkpoint saved on every rank (the step boundary, the save, the barrier). :func:`needed_lead_s`
is a robust estimate over the recent stops (the median of the newest :data:`RECENT_STOPS`, plus a
margin for the requeue: one stop whose signal landed at the start of an evaluation does not set
it for good), :func:`lead_notes` says in words where the
spec (``requeue.signal_delay_s``: the time-limit warning) or the partition (``GraceTime``: what a
preempted job gets) leaves less; ``jobs submit`` prints them before submitting. A run whose
measured stop needs more than ``signal_delay_s`` stops itself that much before its time limit
(:class:`EarlyStop`, armed by the run session with :func:`early_stop_lead_s`), so that the time
limit never lands mid-save; never more than :data:`MAX_LEAD_FRACTION` of the time the attempt
has, so that a slow stop can never lock a run into stopping at once (every attempt keeps most of
its time for progress).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "MARGIN_S",
    "MAX_LEAD_FRACTION",
    "RECENT_STOPS",
    "EarlyStop",
    "early_stop_lead_s",
    "lead_notes",
    "needed_lead_s",
]

log = logging.getLogger(__name__)

#: Seconds kept beyond the measured stop: the requeue itself and the process exit.
MARGIN_S = 10.0
#: How many of the newest measured stops the needed lead is estimated from (their median).
RECENT_STOPS = 5
#: The early stop takes at most this fraction of the time an attempt has left when it starts.
MAX_LEAD_FRACTION = 0.25


def needed_lead_s(events: Iterable[Mapping[str, Any]]) -> float | None:
    """The (upper) median of the newest :data:`RECENT_STOPS` measured stops (signal -> saved
    checkpoint) plus :data:`MARGIN_S`; None when no stop of this run was measured yet."""
    seen = [
        float(e["since_signal_s"])
        for e in events
        if e.get("event") == "checkpoint"
        and isinstance(e.get("since_signal_s"), int | float)
        and not isinstance(e.get("since_signal_s"), bool)
        and 0 <= float(e["since_signal_s"]) < 86400
    ]
    return statistics.median_high(seen[-RECENT_STOPS:]) + MARGIN_S if seen else None


def early_stop_lead_s(
    needed_s: float | None, signal_delay_s: float, window_s: float
) -> float | None:
    """How long before its time limit an attempt stops itself: the needed lead, capped at
    :data:`MAX_LEAD_FRACTION` of ``window_s`` (the time from now to the limit) so the attempt
    keeps the rest for progress; None when Slurm's own signal (``signal_delay_s`` before the
    limit) comes early enough, or there is no time to cap."""
    if needed_s is None or window_s <= 0:
        return None
    lead = min(needed_s, MAX_LEAD_FRACTION * window_s)
    return lead if lead > signal_delay_s else None


def lead_notes(
    needed_s: float | None,
    signal_delay_s: float,
    grace_s: float | None,
    partition: str,
) -> list[str]:
    """One line per window shorter than the measured stop needs (empty: all fit)."""
    if needed_s is None:
        return []
    notes = []
    if needed_s > signal_delay_s:
        notes.append(
            f"jobs: this run's stops took up to {needed_s - MARGIN_S:.0f} s from the signal to a "
            f"saved checkpoint (+{MARGIN_S:.0f} s to requeue) but requeue.signal_delay_s is "
            f"{signal_delay_s:.0f}: the run stops itself {needed_s:.0f} s before its time limit "
            f"(set requeue.signal_delay_s to at least {needed_s:.0f})"
        )
    if grace_s is not None and 0 < grace_s < needed_s:
        notes.append(
            f"jobs: partition {partition} gives a preempted job {grace_s:.0f} s (GraceTime) "
            f"but this run's stops need {needed_s:.0f} s: a preemption may kill it before its "
            "checkpoint is saved (work since the last periodic save is redone; save more often: "
            "train.checkpoint.interval_steps, or ask the admins for a longer GraceTime)"
        )
    return notes


class EarlyStop:
    """Calls ``trigger()`` once, ``lead_s`` seconds before ``end_time`` (a daemon timer)."""

    def __init__(self, end_time: float, lead_s: float, trigger: Callable[[], None]) -> None:
        self.at = end_time - lead_s
        self._timer = threading.Timer(max(0.0, self.at - time.time()), trigger)
        self._timer.daemon = True

    def start(self) -> EarlyStop:
        self._timer.start()
        log.warning(
            "this run's stops need more than requeue.signal_delay_s: it stops itself at %s",
            time.strftime("%H:%M:%S", time.localtime(self.at)),
        )
        return self

    def cancel(self) -> None:
        self._timer.cancel()
