"""Stop signals: the early-signal store and the preemption guard (torch-free, stdlib only).

The protocol (the run session drives it; user code can too)::

    guard = PreemptionGuard((requeue.signal, "TERM")).install()   # handler only sets a flag
    for step in ...:
        train_step()
        if guard.should_stop(all_reduce_max):   # every rank, at the same step boundaries
            ...save, wait, barrier, train.stop.request_requeue(...)

A stop signal can arrive before the guard exists (Slurm may send the time-limit signal while
Python is still importing torch). :func:`install_early` is called first thing by every launcher
(``jobs.launch.TrainLaunch`` and ``python -m train``): its handler only records the signal in ONE
process-wide store, which :meth:`PreemptionGuard.install` takes over (the run stops at its first
step boundary) or a command entrypoint passes on to its child (:func:`pop_early_signals`).
What happens next (why Slurm stops the job, events, budgets, requeue) is decided in one place:
:mod:`train.stop` (the protocol), :func:`train.stop.decision.decide`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from train.stop import facts
from train.stop.facts import StopKind

__all__ = [
    "PreemptionGuard",
    "early_handler",
    "early_signal_pending",
    "install_early",
    "note_early_signal",
    "pop_early_signals",
    "signum",
    "term_received_at",
]

log = logging.getLogger(__name__)


# Stop signals that arrived before a PreemptionGuard was installed: (signal, time).
_EARLY: list[tuple[signal.Signals, float]] = []
# When this process first got SIGTERM through a handler of this module (time.monotonic()).
_TERM_AT: list[float] = []


def _note_term(signum: int) -> None:
    # list.append is atomic under the GIL: safe inside a signal handler
    if signum == signal.SIGTERM and not _TERM_AT:
        _TERM_AT.append(time.monotonic())


def term_received_at() -> float | None:
    """When (``time.monotonic()``) this process first got SIGTERM through the early handler or
    a :class:`PreemptionGuard`, whichever held it then; None if it never did. srun sends it to
    every other task the moment one exits badly: a rank whose collective failed may have got
    it before it failed (:mod:`train.stop.act` reads it)."""
    return _TERM_AT[0] if _TERM_AT else None


def note_early_signal(signum: int, when: float | None = None) -> None:
    """Remember a stop signal received before the guard exists: the next
    :meth:`PreemptionGuard.install` turns it into a stop."""
    _EARLY.append((signal.Signals(signum), time.time() if when is None else when))


def early_signal_pending() -> bool:
    """Whether a stop signal is held in the store (nothing is taken)."""
    return bool(_EARLY)


def pop_early_signals() -> list[signal.Signals]:
    """Take the stop signals remembered since :func:`install_early` (oldest first).

    For code that installs no :class:`PreemptionGuard` after ``install_early`` (e.g. a command
    entrypoint): it must pass them on (to its child) or act on them, else a SIGTERM that arrived
    during startup would be swallowed and the process would not stop.
    """
    taken = [s for s, _ in _EARLY]
    _EARLY.clear()
    return taken


def early_handler(signum: int, frame: FrameType | None) -> None:
    """The handler :func:`install_early` installs: it only records the signal."""
    # list.append is atomic under the GIL; no logging or I/O inside a signal handler.
    _note_term(signum)
    note_early_signal(signum)


def install_early(signals: Sequence[str | int] = ("USR2", "TERM")) -> None:
    """Call first thing in a training process, before importing torch (main thread only).

    With the default action a signal during start-up kills the task and the job FAILS instead of
    being requeued. These handlers only remember the signal; :meth:`PreemptionGuard.install`
    picks it up and the run stops (checkpoint + requeue) at its first step boundary. After the
    guard is uninstalled they remember (ignore) late repeats. Code that installs no guard
    afterwards must take them with :func:`pop_early_signals`.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for s in dict.fromkeys(signum(x) for x in signals):
        signal.signal(s, early_handler)


def signum(sig: str | int | signal.Signals) -> signal.Signals:
    """``"USR2"``, ``"SIGUSR2"``, ``12`` -> ``signal.SIGUSR2``."""
    if isinstance(sig, signal.Signals):
        return sig
    if isinstance(sig, int):
        return signal.Signals(sig)
    name = sig.strip().upper()
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]


class PreemptionGuard:
    """Turns stop signals into a flag that all ranks agree on at step boundaries.

    ``job_id``/``signal_delay_s``/``is_main``: when given, :attr:`reason` on the main rank asks
    Slurm whether this is a preemption or the time limit (:func:`train.stop.facts.classify_stop`).
    """

    def __init__(
        self,
        signals: Sequence[str | int] = ("USR2", "TERM"),
        *,
        job_id: str | None = None,
        signal_delay_s: float = 90.0,
        is_main: bool = True,
    ) -> None:
        self.signals = tuple(dict.fromkeys(signum(s) for s in signals))
        self.job_id = job_id
        self.signal_delay_s = signal_delay_s
        self.is_main = is_main
        self._flag = False
        self._received: signal.Signals | None = None
        self._received_at: float | None = None
        self._stopping = False
        self._reason: StopKind | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> PreemptionGuard:
        """Install the handlers (main thread only) and take over early signals; returns self."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("signal handlers can only be installed from the main thread; skipped")
            return self
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        early = [(s, t) for s, t in _EARLY if s in self.signals]
        _EARLY.clear()
        if early and not self._flag:
            # a stop signal arrived during startup: honour it at the first step boundary
            self._received, self._received_at = early[0]
            self._flag = True
            log.warning("%s arrived during startup: stopping at the first step", early[0][0].name)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were installed before :meth:`install`."""
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: no logging, locks, I/O or collectives inside a signal handler.
        _note_term(signum)
        if not self._flag:
            self._received = signal.Signals(signum)
            self._received_at = time.time()
        self._flag = True

    def trigger(self, sig: str | int = "USR2") -> None:
        """Request a stop as if ``sig`` had arrived (tests, user code, a watchdog)."""
        self._handle(int(signum(sig)), None)

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal (not yet agreed with other ranks)."""
        return self._flag

    @property
    def received_at(self) -> float | None:
        """When (``time.time()``) the first stop signal arrived, if one did."""
        return self._received_at

    @property
    def signal_name(self) -> str | None:
        """Name of the first stop signal this process received (``"SIGUSR2"``), if any."""
        return self._received.name if self._received is not None else None

    def should_stop(self, all_reduce_max: Callable[[int], int]) -> bool:
        """Whether any rank got a stop signal; every rank must call this at the same step.

        ``all_reduce_max`` reduces an int over ranks with MAX (``lambda x: x`` for one
        process); it runs every call so that ranks stay in lockstep.
        """
        agreed = int(all_reduce_max(1 if self._flag else 0)) > 0
        if agreed and not self._stopping:
            self._stopping = True
            log.warning(
                "stop requested (%s): checkpointing at this step boundary",
                self.signal_name or "signal on another rank",
            )
        return agreed

    @property
    def reason(self) -> StopKind | None:
        """``"preemption"``, ``"timeout"``, ``"cancel"`` or ``"signal"`` (unclassified): for user
        code that drives a guard of its own. The run's stop decision does not read it (it asks
        Slurm once, :func:`train.stop.facts.gather`)."""
        if not self._stopping and not self._flag:
            return None
        if self._reason is None:
            self._reason = "signal"
            if self.is_main and self.job_id:
                self._reason = facts.classify_stop(self.job_id, self.signal_delay_s)
        return self._reason
