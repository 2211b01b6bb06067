"""Issue 46: the supervisor's set-up waits behind the start of a command started first
(train.command.prestart.wait_behind): until the command's main thread is mostly not running,
a stop signal is held, the command exits, or the cap. The looks are given (pure) except in the
last cases, which run a real command and a real signal. End to end through the task's entry
point: tests/unit/jobs/test_command_first.py (``..._waits_behind_the_commands_own_start``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from train.command import prestart
from train.command.prestart import QUIET_LOOKS, QUIET_RUNNING, Prestarted, wait_behind
from train.stop.signals import install_early, pop_early_signals


@pytest.fixture
def sleeper() -> Iterator[Prestarted]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield Prestarted(proc, [], time.time())
    finally:
        proc.kill()
        proc.wait()


def _looks(
    states: str, written: list[int] | None = None
) -> Callable[[int], tuple[str | None, int]]:
    """A command seen as ``states`` (one letter per look, the last repeated)."""
    seq = iter(range(10**6))

    def look(pid: int) -> tuple[str | None, int]:
        i = next(seq)
        w = written[min(i, len(written) - 1)] if written else 0
        return states[min(i, len(states) - 1)], w

    return look


def test_a_start_that_runs_is_waited_for_until_it_mostly_does_not(sleeper: Prestarted) -> None:
    busy, quiet = "R" * 30, "S"
    n = []

    def pending() -> bool:
        n.append(1)
        return False

    why = wait_behind(sleeper, cap_s=60, poll_s=0, pending=pending, look=_looks(busy + quiet))
    # quiet once no more than QUIET_RUNNING of the last QUIET_LOOKS looks saw it running
    assert why == "quiet" and len(n) == 30 + QUIET_LOOKS - QUIET_RUNNING


@pytest.mark.parametrize(("running", "why"), [(QUIET_RUNNING, "quiet"), (QUIET_RUNNING + 1, "cap")])
def test_quiet_is_at_most_a_quarter_of_the_window_running(
    sleeper: Prestarted, running: int, why: str
) -> None:
    # a steady pattern: `running` looks of every QUIET_LOOKS see it running (a step's compute)
    pattern = ("R" * running + "S" * (QUIET_LOOKS - running)) * 50
    got = wait_behind(sleeper, cap_s=0.3, poll_s=0.001, pending=lambda: False,
                      look=_looks(pattern))  # fmt: skip
    assert got == why


def test_a_held_stop_signal_ends_the_wait_at_once(sleeper: Prestarted) -> None:
    calls = iter([False, False, True])
    why = wait_behind(sleeper, cap_s=60, poll_s=0, pending=lambda: next(calls), look=_looks("R"))
    assert why == "signal"


def test_the_commands_exit_ends_the_wait() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    why = wait_behind(Prestarted(proc, [], time.time()), cap_s=60, pending=lambda: False,
                      look=_looks("R"))  # fmt: skip
    assert why == "exited"


def test_the_first_write_seen_is_handed_on(sleeper: Prestarted) -> None:
    before = time.time()
    wait_behind(sleeper, cap_s=60, poll_s=0, pending=lambda: False,
                look=_looks("R" * 5 + "S", written=[10, 10, 10, 250]))  # fmt: skip
    assert sleeper.first_write_at is not None and sleeper.first_write_at >= before


def test_no_write_no_first_output(sleeper: Prestarted) -> None:
    wait_behind(sleeper, cap_s=60, poll_s=0, pending=lambda: False, look=_looks("S", [10]))
    assert sleeper.first_write_at is None


def test_a_real_busy_command_and_a_real_signal(sleeper: Prestarted) -> None:
    # the command never goes quiet (a busy loop); Slurm's signal, held by the early store,
    # ends the wait long before the cap
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    previous = signal.getsignal(signal.SIGUSR2)
    install_early(("USR2",))
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2)).start()
        why = wait_behind(Prestarted(busy, [], time.time()), cap_s=120)
        assert why == "signal" and pop_early_signals() == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
        busy.kill()
        busy.wait()


def test_a_real_command_is_read_from_proc(sleeper: Prestarted) -> None:
    time.sleep(0.2)
    state, written = prestart._state_and_written(sleeper.proc.pid)
    assert state == "S" and written >= 0
    assert prestart._state_and_written(2**22 + 12345) == (None, 0)  # no such process


def test_a_command_is_waited_for_once(sleeper: Prestarted) -> None:
    # jobs.taskstart waits before submitit loads; TrainLaunch then goes on at once
    assert wait_behind(sleeper, cap_s=0, pending=lambda: False, look=_looks("R")) == "cap"
    assert wait_behind(sleeper, cap_s=60, pending=lambda: False, look=_looks("R")) == "waited"
