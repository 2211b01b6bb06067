"""What submitit runs inside the allocation: :class:`TrainLaunch` (picklable, torch-free).

Each srun task unpickles it and calls it. It takes the signals back from submitit (whose own
handlers would requeue or exit on their own terms), then imports ``train`` lazily and runs
``train.cli.main`` in-process; train's preemption guard installs its own handlers, saves at a
step boundary and requeues through Slurm. The job's exit status is train's exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

# Signals that arrived between submitit's start and train's guard being installed.
EARLY_SIGNALS: list[tuple[int, float]] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the training loop has not started, so there is nothing to save yet.
    EARLY_SIGNALS.append((signum, time.time()))
    print(
        f"jobs.launch: signal {signal.Signals(signum).name} before training started",
        file=sys.stderr,
    )


def forward_early_signals(stop: threading.Event, poll_s: float = 0.1) -> None:
    """Re-send early signals once a Python handler (train's guard) has replaced ours.

    A preemption that lands while torch is being imported would otherwise be lost; re-sending
    it makes the guard checkpoint and requeue at the first step boundary. Runs in a daemon
    thread until ``stop`` is set.
    """
    while not stop.wait(poll_s):
        for signum, when in list(EARLY_SIGNALS):
            handler = signal.getsignal(signum)
            # Only to a Python handler: re-sending to SIG_DFL would kill the process.
            if handler is not _remember and callable(handler):
                EARLY_SIGNALS.remove((signum, when))
                os.kill(os.getpid(), signum)


def release_submitit_signals(names: tuple[str, ...] = ("USR2", "TERM")) -> None:
    """Replace submitit's handlers (requeue on USR2, ignore TERM) until train installs its own."""
    for name in dict.fromkeys(names):
        sig = getattr(signal, f"SIG{name}", None)
        if sig is not None:
            signal.signal(sig, _remember)


@dataclass(frozen=True)
class TrainLaunch:
    """Run ``python -m train --config CONFIG --run-dir RUN_DIR [extra...]`` in this process.

    ``signal_name`` is the spec's requeue signal (USR2 by default); it is released from
    submitit as well as USR2 and TERM. ``resolved`` (JSON) is the task's validated spec when
    it was not written at submission (big sweeps): the task writes ``config`` from it first.
    """

    config: str
    run_dir: str
    signal_name: str = "USR2"
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    resolved: str = ""

    def materialize(self) -> None:
        """Write ``config`` from ``resolved`` unless it exists (every rank may race: atomic)."""
        path = Path(self.config)
        if not self.resolved or path.exists():
            return
        import json

        import yaml

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        data = json.loads(self.resolved)
        tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        os.replace(tmp, path)

    def argv(self) -> list[str]:
        return ["--config", self.config, "--run-dir", self.run_dir, *self.extra_args]

    def __call__(self) -> int:
        release_submitit_signals(("USR2", "TERM", self.signal_name))
        # submitit requeues on its own only for checkpointable callables after a timeout; we are
        # not one (no .checkpoint), and train decides about requeues through its budgets.
        os.environ.setdefault("SLURM_TRAIN_RUN_DIR", self.run_dir)
        self.materialize()
        stop = threading.Event()
        threading.Thread(target=forward_early_signals, args=(stop,), daemon=True).start()
        try:
            from train.cli import main  # torch is imported here, inside the allocation only

            code = int(main(self.argv()) or 0)
        finally:
            stop.set()
        if code != 0:
            # SystemExit passes through submitit's `except Exception`: the task (and so the
            # Slurm job) ends with train's exit code instead of a generic failure.
            raise SystemExit(code)
        return code
