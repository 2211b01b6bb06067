"""The only code that runs Slurm commands, plus a real local dev cluster.

Public surface:
- :func:`cluster.slurm.slurm_client`: THE factory of a Slurm client (:class:`cluster.slurm.Slurm`,
  the typed protocol of what ``train`` and ``jobs`` ask of Slurm); today's transport is
  :class:`cluster.client.SlurmClient`: typed calls over sinfo/scontrol/squeue/sacct/sbatch/scancel.
- :func:`cluster.hostlist.expand_hostlist`: Slurm hostlist expressions to host names.
- :func:`cluster.timefmt.parse_slurm_time`: Slurm time strings to seconds.
- :mod:`cluster.errors`: one error tree.

This package never imports torch; ``cluster.hostlist`` and ``cluster.timefmt`` import nothing
outside the standard library so any part of the project may use them.
"""

from __future__ import annotations

from cluster.errors import ClusterError, SlurmCommandError, SlurmNotFoundError
from cluster.hostlist import expand_hostlist
from cluster.slurm import Slurm, SlurmFactory, slurm_client

__all__ = [
    "ClusterError",
    "Slurm",
    "SlurmCommandError",
    "SlurmFactory",
    "SlurmNotFoundError",
    "expand_hostlist",
    "slurm_client",
]
