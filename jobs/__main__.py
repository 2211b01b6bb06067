"""``python -m jobs``: see :mod:`jobs.cli`.

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

gc.disable()

from jobs.cli import main  # noqa: E402  (after gc.disable, on purpose)

code = main()
gc.freeze()
raise SystemExit(code)
