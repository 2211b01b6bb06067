"""StopPoll: when the ranks check for a stop signal (fake clock and collective)."""

from __future__ import annotations

from typing import Any

from train.runtime import StopPoll


class FakeRuntime:
    def __init__(self, distributed: bool, others_k: int = 10_000) -> None:
        self.distributed = distributed
        self.others_k = others_k
        self.reduced: list[int] = []

    def all_reduce_max(self, value: int) -> int:
        self.reduced.append(value)
        return max(value, -self.others_k)  # MAX of -k: the other rank's k may be smaller


class Clock:
    def __init__(self, step_s: float) -> None:
        self.t, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        return self.t


def _checks(poll: StopPoll, clock: Clock, start: int, end: int) -> list[int]:
    out = []
    for step in range(start + 1, end + 1):
        clock.t += clock.step_s
        if poll.due(step):
            out.append(step)
    return out


def test_one_process_checks_every_step() -> None:
    clock = Clock(0.01)
    poll = StopPoll(FakeRuntime(False), 0.5, 0, clock=clock)  # type: ignore[arg-type]
    assert _checks(poll, clock, 0, 40) == list(range(1, 41))


def test_zero_interval_checks_every_step() -> None:
    clock = Clock(0.01)
    rt: Any = FakeRuntime(True)
    assert _checks(StopPoll(rt, 0.0, 0, clock=clock), clock, 0, 30) == list(range(1, 31))
    assert rt.reduced == []


def test_distributed_calibrates_once_then_checks_every_k_steps() -> None:
    clock = Clock(0.05)  # 50 ms steps, 0.5 s interval: k = 10
    rt: Any = FakeRuntime(True)
    poll = StopPoll(rt, 0.5, 100, skip=5, calibrate_steps=5, clock=clock)
    checks = _checks(poll, clock, 100, 160)
    assert checks[:10] == list(range(101, 111))  # every step until the calibration at 110
    assert poll.every == 10 and rt.reduced == [-10]  # one collective, MIN over ranks
    assert checks[10:] == [120, 130, 140, 150, 160]


def test_the_slowest_rank_sets_k() -> None:
    clock = Clock(0.001)
    rt: Any = FakeRuntime(True, others_k=3)
    poll = StopPoll(rt, 0.5, 0, clock=clock)
    _checks(poll, clock, 0, 20)
    assert poll.every == 3


def test_k_is_capped_and_slow_steps_mean_every_step() -> None:
    clock = Clock(1e-7)
    fast = StopPoll(FakeRuntime(True), 60.0, 0, clock=clock)  # type: ignore[arg-type]
    _checks(fast, clock, 0, 11)
    assert fast.every == 10_000
    slow_clock = Clock(2.0)
    slow = StopPoll(FakeRuntime(True), 0.5, 0, clock=slow_clock)  # type: ignore[arg-type]
    assert _checks(slow, slow_clock, 0, 30) == list(range(1, 31))
    assert slow.every == 1
