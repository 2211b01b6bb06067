"""The exit at a stop (issue 46), for a supervised command's Python interpreters.

:mod:`train.command.fastexit` puts this folder first on a supervised command's ``PYTHONPATH``
(it holds this file and nothing else: it shadows no module of the user's). Python imports
``sitecustomize`` as it starts; this one registers one ``atexit`` function and then imports the
``sitecustomize`` it shadows (the user's, a tool's, the distribution's), as Python would have
without it: that one's errors are reported by Python as before, and ``sys.modules`` holds it.
Nothing else is imported (stdlib ``atexit``, ``gc``, ``os``, ``sys``: no project module, no
CPU the command's start can feel), and no signal handler is touched.

What it does: registered first, its function runs after every other ``atexit`` function of the
interpreter (last in, first out: the user's own, torch's, logging's flush, wandb's). When the
supervisor is stopping the run (its node-local marker, ``SLURM_TRAIN_STOPPING``, exists) it
calls ``gc.freeze()``: the interpreter's finalization then skips the garbage collector's passes
over every object still alive (torch's modules, the model: 0.5-0.9 s of a 2-core node after
the script's last line, measured in bench/README.md), which the job's nodes would otherwise
wait for before Slurm can start its next run. Objects are still freed by their reference counts
and files closed as before; what is skipped is collecting the reference cycles still alive at
exit, whose ``__del__`` Python never promises to run at exit. Outside a stop (the run
completed, a failure) the exit is Python's own. ``SLURM_TRAIN_FAST_EXIT=0`` in the run's
environment turns this off (nothing is put on ``PYTHONPATH``).

Written for any Python 3 (no annotations, no f-strings): the user's interpreter is theirs.
"""

import atexit
import gc
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = os.environ.get("SLURM_TRAIN_STOPPING", "")


def _exit_at_once():
    # type: () -> None
    # os.path.exists raises nothing (a path it cannot look at is False)
    if _MARK and os.path.exists(_MARK) and hasattr(gc, "freeze"):
        gc.freeze()


def _ours(entry):
    # type: (str) -> bool
    try:
        return bool(entry) and os.path.abspath(entry) == _HERE
    except Exception:
        return False


def _chain():
    # type: () -> None
    """Import the ``sitecustomize`` this one shadows, if any (its errors propagate to Python's
    start-up, which reports them as it always did)."""
    this = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if not _ours(p)]
    try:
        __import__("sitecustomize")
    except ImportError as exc:
        if getattr(exc, "name", None) != "sitecustomize":
            raise
        if this is not None:  # none other: this one stays the interpreter's
            sys.modules["sitecustomize"] = this


atexit.register(_exit_at_once)
_chain()
