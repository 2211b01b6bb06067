"""The user's front door: a YAML job spec and the ``python -m jobs`` command line.

``jobs.spec`` loads and validates a spec (strict pydantic models, errors with file:line:column),
``jobs.preflight`` checks it against the live cluster, ``jobs.render``/``jobs.submit`` turn it into
one submitit submission (a job array for a sweep), ``jobs.records`` keeps a run directory and an
index so ``status``/``logs``/``cancel``/``list`` work from any later shell.

This package never imports torch: the command line stays fast, and only
:class:`jobs.launch.TrainLaunch`, inside the allocation, imports ``train`` lazily.
"""

from __future__ import annotations

__all__: list[str] = []
