"""``python -m jobs``: see :mod:`jobs.cli`.

First, before anything imports ``train`` or ``cluster``: ``python -m`` put the working directory
first on ``sys.path``, and a user's ``train.py`` (or ``cluster.py``, ``jobs/``) there would be
imported in place of this project's package (:mod:`train.safepath`). The guard itself comes from
``train``, so it is imported with that entry out of ``sys.path`` (our ``jobs`` is running, so
our ``train`` sits beside it), then the entry goes back and the guard looks into it without
importing anything of the user's. (A user's ``jobs/`` is run by Python before any of this: only
``slurm-train`` or ``python -P -m jobs`` can help there, and the README says so.)

One command, then the process ends. Its start-up builds tens of thousands of objects that live
until the end (pydantic's schemas and validators, the modules), and CPython's cyclic collector
would scan them again and again while they are built and once more at exit, finding nothing:
about 20 ms of a 150 ms ``submit --dry-run``. So the collector is off from here, a command that
runs long (``--follow``, ``drill``) turns it back on (:func:`jobs.cli.main`), and what is alive
at the end is frozen (``gc.freeze``) before the interpreter takes it down. Reference counting
still frees everything as usual; exit handlers and buffers run and flush as usual.
"""

from __future__ import annotations

import gc
import sys

gc.disable()

_first = None if getattr(sys.flags, "safe_path", False) or not sys.path else sys.path.pop(0)
try:
    from train import safepath
except ImportError:  # our packages are found only through that entry: it is this checkout
    safepath = None  # type: ignore[assignment]
finally:
    if _first is not None:
        sys.path.insert(0, _first)
if safepath is not None:
    safepath.refuse_shadowing(
        safepath.unsafe_first_entry(),
        safepath.PACKAGES,
        "`slurm-train ...` or `python -P -m jobs ...` instead",
    )

from jobs.cli import main  # noqa: E402  (after gc.disable and the guard, on purpose)

code = main()
gc.freeze()
raise SystemExit(code)
