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
