"""``python -m train``: parse and delegate to :func:`train.cli.main`."""

from __future__ import annotations

import signal
import sys

_STOP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM")

if __name__ == "__main__":
    # Before anything imports `cluster` (the early-signal store below does, through the stop
    # facts): a user's cluster.py in the working directory, first on sys.path under
    # `python -m`, would be imported in its place (train.safepath). stdlib only, a few ms.
    from train import safepath

    safepath.refuse_shadowing(
        safepath.unsafe_first_entry(), ("cluster",), "`python -P -m train ...` instead"
    )
    # Then, before the spec loader and torch are imported (seconds on a busy node): a stop
    # signal Slurm sends in that window is kept for the guard instead of killing the task
    # (which would end the job FAILED instead of requeued). stdlib only, so it costs ~nothing.
    from train.stop import install_early

    install_early(_STOP_SIGNALS)
    from train.startup import pause_collector

    pause_collector()  # until the run starts (train.startup says why)
    from train.cli import main

    code = main()
    if code != 0:
        from train.startup import leave

        leave(code)  # a stop of the built-in trainer: Python's exit but for its teardown
    if code == 0:
        # Finished: a stop signal during interpreter shutdown (a preemption racing the end)
        # must not turn the completed task into a failed one.
        for name in _STOP_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    sys.exit(code)
