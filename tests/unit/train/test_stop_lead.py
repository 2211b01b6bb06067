"""The warning fits the save (issue 26): a stop measured from the signal to the saved
checkpoint, compared with what the spec and the partition give."""

from __future__ import annotations

import threading

from train.stop.lead import MARGIN_S, EarlyStop, lead_notes, needed_lead_s


def test_the_longest_measured_stop_plus_a_margin() -> None:
    events = [
        {"event": "signal", "step": 10},
        {"event": "checkpoint", "step": 10, "since_signal_s": 12.5},
        {"event": "checkpoint", "step": 20},  # a periodic save: no signal, nothing measured
        {"event": "checkpoint", "step": 30, "since_signal_s": 41.0},
        {"event": "checkpoint", "since_signal_s": "41"},  # damaged: skipped
        {"event": "checkpoint", "since_signal_s": True},
        {"event": "checkpoint", "since_signal_s": -3},
    ]
    assert needed_lead_s(events) == 41.0 + MARGIN_S
    assert needed_lead_s([]) is None


def test_notes_name_the_numbers_and_the_fix() -> None:
    assert lead_notes(None, 90, 20, "debug") == []
    assert lead_notes(30.0, 90, None, "debug") == []
    short = lead_notes(51.0, 30, None, "debug")
    assert len(short) == 1 and "requeue.signal_delay_s is 30" in short[0]
    assert "at least 51" in short[0]
    grace = lead_notes(51.0, 90, 20, "low")
    assert len(grace) == 1 and "partition low" in grace[0] and "20 s (GraceTime)" in grace[0]


def test_the_early_stop_fires_once_at_its_time() -> None:
    fired = threading.Event()
    import time

    stop = EarlyStop(time.time() + 0.2, 0.1, fired.set).start()
    assert fired.wait(5)
    stop.cancel()
    later = threading.Event()
    cancelled = EarlyStop(time.time() + 60, 1, later.set).start()
    cancelled.cancel()
    assert not later.wait(0.2)


def test_one_slow_stop_does_not_set_the_lead_for_good() -> None:
    """Issue 44 item 9: a stop whose signal landed at the start of an evaluation (100 s) among
    fast ones (3 s): the estimate is the recent stops' median, not the slowest ever."""
    events = [{"event": "checkpoint", "since_signal_s": s} for s in (100.0, 3.0, 2.0, 4.0, 3.0)]
    assert needed_lead_s(events) == 3.0 + MARGIN_S
    # only the newest stops count: an old slow era is forgotten
    events = [{"event": "checkpoint", "since_signal_s": s} for s in (90.0,) * 5 + (5.0,) * 5]
    assert needed_lead_s(events) == 5.0 + MARGIN_S


def test_the_early_stop_never_takes_most_of_an_attempt() -> None:
    """The scaled-down run of issue 44: 120 s attempts warned 30 s ahead, one stop measured at
    100 s: the run used to stop itself 110 s early, one step per attempt until max_timeouts was
    spent. The lead is capped at a quarter of the attempt's time."""
    from train.stop.lead import MAX_LEAD_FRACTION, early_stop_lead_s

    needed = needed_lead_s([{"event": "checkpoint", "since_signal_s": 100.0}])
    assert needed == 110.0
    assert early_stop_lead_s(needed, 30, 120) is None  # capped at 30 s: Slurm's signal does
    lead = early_stop_lead_s(needed, 30, 400)
    assert lead == MAX_LEAD_FRACTION * 400 == 100  # the attempt keeps 300 s for progress
    assert early_stop_lead_s(45.0, 30, 400) == 45.0  # what the stops need, when it fits
    assert early_stop_lead_s(25.0, 30, 400) is None  # Slurm's own signal is early enough
    assert early_stop_lead_s(None, 30, 400) is None
    assert early_stop_lead_s(60.0, 30, -5) is None  # past the limit already: nothing to arm
