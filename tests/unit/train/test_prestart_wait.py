"""Issue 46: the supervisor's set-up waits behind the start of a command started first
(train.command.prestart.wait_behind): until the command used at most half a core over the last
two seconds, a stop signal is held, the command exits, or the cap. The looks and the clock are
given (pure) except in the last cases, which run a real command and a real signal. End to end
through the task's entry points: tests/unit/jobs/test_command_first.py
(``..._waits_behind_the_commands_own_start``) and tests/unit/jobs/test_taskstart.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from train.command import prestart
from train.command.prestart import QUIET_CPU, QUIET_WINDOW_S, Prestarted, wait_behind
from train.stop.signals import install_early, pop_early_signals

STEP = 0.05  # the fake clock's time between two looks (the real poll)


@pytest.fixture
def sleeper() -> Iterator[Prestarted]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield Prestarted(proc, [], time.time())
    finally:
        proc.kill()
        proc.wait()


class Command:
    """A command seen through fake looks: each look, the clock moves STEP and the command uses
    ``use(i)`` cores of it (i: the look's index); ``written(i)`` bytes so far."""

    def __init__(self, use: Callable[[int], float], written: Callable[[int], int] = lambda i: 0):
        self.use, self.written = use, written
        self.now, self.cpu, self.looks = 0.0, 0.0, 0

    def look(self, pid: int) -> tuple[float | None, int]:
        i = self.looks
        self.looks += 1
        self.now += STEP
        self.cpu += self.use(i) * STEP
        return self.cpu, self.written(i)

    def clock(self) -> float:
        return self.now

    def wait(
        self, started: Prestarted, cap_s: float = 60.0, pending: Callable[[], bool] = lambda: False
    ) -> str:
        return wait_behind(started, cap_s=cap_s, poll_s=0, pending=pending, look=self.look,
                           clock=self.clock)  # fmt: skip


def test_a_start_that_uses_its_core_is_waited_for_until_it_mostly_does_not(
    sleeper: Prestarted,
) -> None:
    busy = 30  # 1.5 s of a whole core (an import), then 10% (a training step and a sleep)
    cmd = Command(lambda i: 1.0 if i < busy else 0.1)
    assert cmd.wait(sleeper) == "quiet"
    # never before its start is over and two seconds of the window are seen, nor much later
    assert cmd.looks > busy and cmd.looks * STEP >= QUIET_WINDOW_S
    assert cmd.looks < busy + 2 * QUIET_WINDOW_S / STEP


@pytest.mark.parametrize(("use", "why"), [(QUIET_CPU - 0.05, "quiet"), (QUIET_CPU + 0.1, "cap")])
def test_quiet_is_at_most_half_a_core_over_the_window(
    sleeper: Prestarted, use: float, why: str
) -> None:
    assert Command(lambda i: use).wait(sleeper, cap_s=5 * QUIET_WINDOW_S) == why


def test_a_stopped_command_is_quiet(sleeper: Prestarted) -> None:
    # kill -STOP (or a wait in I/O): no CPU at all; after its window the set-up goes on
    cmd = Command(lambda i: 1.0 if i < 10 else 0.0)
    assert cmd.wait(sleeper) == "quiet"


def test_a_held_stop_signal_ends_the_wait_at_once(sleeper: Prestarted) -> None:
    calls = iter([False, False, True])
    cmd = Command(lambda i: 1.0)
    assert cmd.wait(sleeper, pending=lambda: next(calls)) == "signal" and cmd.looks == 2


def test_the_commands_exit_ends_the_wait() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert Command(lambda i: 1.0).wait(Prestarted(proc, [], time.time())) == "exited"


def test_the_first_write_seen_is_handed_on(sleeper: Prestarted) -> None:
    before = time.time()
    Command(lambda i: 1.0 if i < 5 else 0.0, lambda i: 10 if i < 3 else 250).wait(sleeper)
    assert sleeper.first_write_at is not None and sleeper.first_write_at >= before


def test_no_write_no_first_output(sleeper: Prestarted) -> None:
    Command(lambda i: 0.0, lambda i: 10).wait(sleeper)
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
    cpu, written = prestart._cpu_and_written(os.getpid())
    assert cpu is not None and cpu > 0 and written >= 0
    assert prestart._cpu_and_written(2**22 + 12345) == (None, 0)  # no such process


def test_a_command_is_waited_for_once(sleeper: Prestarted) -> None:
    # jobs.taskstart waits before submitit loads; TrainLaunch then goes on at once
    assert Command(lambda i: 1.0).wait(sleeper, cap_s=0) == "cap"
    assert Command(lambda i: 1.0).wait(sleeper) == "waited"


def test_what_the_main_thread_wanted_from_schedstat_else_its_cpu_time(tmp_path: Path) -> None:
    # on a CPU 1.5 s + waiting for one 0.5 s (a start on a node whose cores are taken)
    pid = tmp_path / "42"
    pid.mkdir()
    (pid / "stat").write_text("42 (py thon) R " + " ".join(["0"] * 10) + " 300 100 0 0\n")
    (pid / "io").write_text("rchar: 5\nwchar: 77\n")
    (pid / "schedstat").write_text("1500000000 500000000 12\n")
    assert prestart._cpu_and_written(42, tmp_path) == (2.0, 77)
    (pid / "schedstat").unlink()  # a kernel that keeps no count: user + system ticks
    ticks = os.sysconf("SC_CLK_TCK")
    assert prestart._cpu_and_written(42, tmp_path) == (400 / ticks, 77)
    (pid / "io").unlink()  # not ours to read: no writes seen
    assert prestart._cpu_and_written(42, tmp_path) == (400 / ticks, 0)
