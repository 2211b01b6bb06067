"""A supervised command's exit at a stop (issue 46): the job leaves its nodes at the command's
last line, not after its interpreter's clean-up.

A Python script's interpreter spends 0.5-0.9 s after its last line (on a 2-core node; torch
loaded) in the garbage collector's passes at finalization, before the process is gone and the
supervisor can requeue the job. At a stop that time is the allocation's. :func:`export` puts
``train/command/boot`` (one ``sitecustomize.py``) first on the command's ``PYTHONPATH`` with
the path of this rank's stop marker (:func:`train.command.selfrequeue.mark_stopping`, written
before the command gets its signal): the command's interpreters (and their Python children:
torchrun's workers, data loader workers) freeze the collector at exit while that marker exists,
after every ``atexit`` function of theirs. Nothing changes before the exit or outside a stop.
The boot module imports the ``sitecustomize`` it shadows, so the user's, a tool's (coverage) and
the distribution's still run. ``SLURM_TRAIN_FAST_EXIT=0`` in the run's environment turns it off.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["BOOT_DIR", "OPT_OUT_ENV", "STOPPING_ENV", "export"]

#: The folder put first on the command's ``PYTHONPATH``: ``sitecustomize.py`` and nothing else.
BOOT_DIR = Path(__file__).resolve().parent / "boot"
#: The path of this rank's stop marker, as the boot module reads it.
STOPPING_ENV = "SLURM_TRAIN_STOPPING"
#: ``0`` (the run's environment): no boot module, the interpreter's exit as Python makes it.
OPT_OUT_ENV = "SLURM_TRAIN_FAST_EXIT"


def export(child: MutableMapping[str, str], stopping: Path | None) -> None:
    """Put the boot folder first on ``child``'s ``PYTHONPATH`` (once; the rest kept in order)
    with ``stopping``, this rank's marker; nothing when there is no marker (no Slurm job), when
    the run opted out, or when the boot module is not there (an install without it)."""
    current = child.get("PYTHONPATH")
    child.pop(STOPPING_ENV, None)
    if stopping is None or child.get(OPT_OUT_ENV, "").strip() == "0":
        return
    if not (BOOT_DIR / "sitecustomize.py").is_file():
        return
    # the user's entries as written (an empty one is the working directory), ours once, first
    rest = [] if current is None else current.split(os.pathsep)
    rest = [p for p in rest if not p or os.path.normpath(p) != str(BOOT_DIR)]
    child["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *rest])
    child[STOPPING_ENV] = str(stopping)
