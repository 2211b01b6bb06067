"""The user's front door: a YAML job spec and the ``python -m jobs`` command line.

- ``jobs.spec`` (models), ``jobs.load`` (YAML -> --set -> validation -> sweep points, errors as
  ``file:line:column: field: problem (hint)``; the YAML rules and overrides are ``train.spec*``);
- ``jobs.preflight``: the spec against the live cluster (partition, MaxTime, nodes, gres);
- ``jobs.render`` (the one spec -> Slurm options mapping and the exact sbatch script),
  ``jobs.templates`` (``--template NAME``), ``jobs.submit`` (dry-run and one submission; a
  sweep is one run of as few job arrays as the cluster allows), ``jobs.launch`` (``TrainLaunch``,
  what runs in the allocation), ``jobs.localrun`` (``--executor local``);
- ``jobs.records`` (run directories and the run index), ``jobs.monitor`` (states, follow, logs,
  cancel), ``jobs.statusview``; ``jobs.cli`` is ``python -m jobs``.

This package never imports torch: the command line stays fast, and only
:class:`jobs.launch.TrainLaunch`, inside the allocation, imports ``train`` lazily.
"""

from __future__ import annotations

__all__: list[str] = []
