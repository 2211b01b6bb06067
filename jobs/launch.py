"""What submitit runs inside the allocation: :class:`TrainLaunch` (picklable, torch-free).

Each srun task unpickles it and calls it. It takes the signals back from submitit (whose own
handlers would requeue or exit on their own terms) into train's early-signal store
(:mod:`train.signals`, stdlib only, imported when the task starts), then imports ``train.cli``
and runs ``train.cli.main`` in-process. A stop signal that arrives before training starts is
kept in that store and train's preemption guard takes it over when it is installed (no
re-sending, no polling thread). The job's exit status is train's exit code.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path


def release_submitit_signals(names: tuple[str, ...] = ("USR2", "TERM")) -> None:
    """Replace submitit's handlers (requeue on USR2, ignore TERM) with train's early-signal
    store until train's guard installs its own handlers."""
    from train.signals import install_early  # torch-free; loaded inside the allocation only

    install_early(names)


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
        from train.startup import pause_collector

        pause_collector()  # until the run starts (train.startup says why)
        from train.cli import main  # torch is imported here, inside the allocation only

        code = int(main(self.argv()) or 0)
        if code == 0:
            # Done (or requeued): a stop signal from now on (a preemption as the tasks exit) must
            # not kill the task while Python shuts down -- it restores SIG_DFL for its own
            # handlers then -- and turn a COMPLETED job into FAILED.
            for name in dict.fromkeys(("USR2", "TERM", self.signal_name)):
                sig = getattr(signal, f"SIG{name}", None)
                if sig is not None:
                    signal.signal(sig, signal.SIG_IGN)
        if code != 0:
            # SystemExit passes through submitit's `except Exception`: the task (and so the
            # Slurm job) ends with train's exit code instead of a generic failure.
            raise SystemExit(code)
        return code
