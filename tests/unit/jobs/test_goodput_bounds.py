"""The goodput ledger for ANY records: the parts add up to the wall time, none is negative,
and a foreign line cannot stretch a 100 s run (a property test over hostile records)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.goodput import PARTS, compute


@dataclass(frozen=True)
class A:
    submit: Any
    start: Any
    end: Any


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(min_value=-50, max_value=150),
    st.lists(st.integers(), max_size=2),
)
TIME = st.one_of(st.floats(min_value=-20, max_value=120), HOSTILE)
KINDS = ["start", "resume", "signal", "preempted", "timeout", "failure", "hang", "node_fail",
         "cancelled", "complete", "budget_exhausted", "restart_in_place", "requeue",
         "checkpoint", "quarantine", "bogus"]  # fmt: skip
EVENT = st.fixed_dictionaries(
    {"time": TIME, "event": st.sampled_from(KINDS)},
    optional={
        "step": st.one_of(st.integers(-5, 500), HOSTILE),
        "restart_count": st.one_of(st.integers(-1, 4), HOSTILE),
        "startup": st.one_of(st.dictionaries(st.text(max_size=3), HOSTILE, max_size=3), HOSTILE),
        "first_output_at": TIME,
        "late": st.one_of(st.just(True), HOSTILE),
        "timeout_s": HOSTILE,
        "observed": st.one_of(
            st.lists(st.one_of(st.fixed_dictionaries({"idle_s": HOSTILE}), HOSTILE), max_size=3),
            HOSTILE,
        ),
        "received_at": TIME,
    },
)
METRIC = st.fixed_dictionaries(
    {"time": TIME, "kind": st.sampled_from(["train", "eval", "other"])},
    optional={
        "step": st.one_of(st.integers(-5, 500), HOSTILE),
        "seconds": HOSTILE,
        "checkpoint_s": HOSTILE,
    },
)
IN_RANGE = st.one_of(st.none(), st.floats(min_value=0, max_value=100))
ATTEMPT = st.builds(A, IN_RANGE, IN_RANGE, IN_RANGE)
STATE = st.sampled_from([None, "PENDING", "RUNNING", "COMPLETED", "CANCELLED", "FAILED"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(EVENT, max_size=12),
    st.lists(METRIC, max_size=12),
    st.lists(ATTEMPT, max_size=4),
    STATE,
    st.booleans(),
)
def test_parts_add_up_to_the_wall_time_for_any_records(
    events: list[dict], metrics: list[dict], attempts: list[A], state: str | None, slurm: bool
) -> None:
    """Submitted at 0, asked at 100, Slurm's times inside that: whatever the run's files say,
    the wall time is at most 100 s, every part >= 0, and the parts add up to it."""
    led = compute(events, metrics, attempts, submitted_at=0.0, now=100.0, state=state,
                  slurm=slurm)  # fmt: skip
    assert set(led.parts) == set(PARTS)
    assert all(v >= 0 for v in led.parts.values()), led.parts
    origin = attempts[0].submit if attempts and attempts[0].submit is not None else 0.0
    assert led.origin == origin and led.end is not None
    assert led.wall_s == pytest.approx(max(0.0, led.end - origin), abs=1e-6)
    assert led.wall_s <= 100.0 + 1e-6
    g = led.goodput
    assert g is None or 0.0 <= g <= 1.0 + 1e-9
    led.line()  # never raises
    assert isinstance(led.to_dict()["wall_s"], float)


def test_one_foreign_metrics_line_cannot_stretch_a_100_s_run() -> None:
    """The review's case: a negative ``seconds`` and a ``checkpoint_s`` that is not a number
    (was: wall_s 1e9)."""
    events = [{"time": 5.0, "event": "start", "step": 0}, {"time": 100.0, "event": "complete"}]
    metrics = [
        {"time": 20.0, "kind": "eval", "seconds": -1e9},
        {"time": 30.0, "kind": "train", "step": 10, "checkpoint_s": 1e9},
        {"time": 40.0, "kind": "train", "step": 20, "checkpoint_s": "x"},
        {"time": 50.0, "kind": "eval", "seconds": float("nan")},
    ]
    led = compute(events, metrics, submitted_at=0.0, now=100.0)
    assert led.wall_s == pytest.approx(100.0)
    assert all(v >= 0 for v in led.parts.values())
