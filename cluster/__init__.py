"""The only code that runs Slurm commands, plus a real local dev cluster.

This module is the package's face: ``jobs/`` and ``train/`` import ``cluster`` and nothing
behind it (``tests/unit/test_layering.py``; ``bench/`` and the tests may reach in):

- :func:`slurm_client`: THE factory of a Slurm client (:class:`Slurm`, the typed protocol of
  what ``train`` and ``jobs`` ask of Slurm; transports: ``cluster/client.py``, ``cluster/ssh.py``);
- the records it returns (``cluster/models.py``: :class:`JobInfo`, :class:`JobAttempt`,
  :class:`ClusterState`, :class:`ClusterLimits`, :class:`Node`, :class:`Partition`,
  ``TERMINAL_STATES``);
- :func:`expand_hostlist` (hostlists), :func:`parse_slurm_time`/:func:`format_slurm_time`
  (Slurm time strings), :func:`parse_user_id` (``scontrol``'s ``UserId``),
  :func:`parse_key_values` (a line of ``scontrol show -o``: ``jobs drill --remote`` batches
  one with its file reads), one error tree (``cluster/errors.py``);
- the SSH transport's pieces ``jobs --remote``/``jobs login`` use (the ``ssh_*`` names,
  :class:`SshTarget`, :class:`SshError`, :class:`SshConnectionError`).

The records, the parser and the SSH names are imported on first use (``_LAZY``, PEP 562):
``from cluster import expand_hostlist`` costs no ``dataclasses``.

``cluster.local`` (the dev cluster) is private to ``cluster/cli.py``. This package never imports
torch; importing it costs only the standard library's ``re`` (no subprocess, no parser: the
client's module is imported when one is built).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cluster.errors import (
    BadInputError,
    ClusterError,
    SlurmCommandError,
    SlurmNotFoundError,
    SlurmTimeError,
)
from cluster.hostlist import expand_hostlist
from cluster.slurm import JobQueries, Slurm, SlurmFactory, slurm_client
from cluster.timefmt import format_slurm_time, parse_slurm_time

if TYPE_CHECKING:
    from cluster.models import (
        TERMINAL_STATES,
        ClusterLimits,
        ClusterState,
        JobAttempt,
        JobInfo,
        Node,
        Partition,
    )
    from cluster.parse import parse_key_values, parse_user_id
    from cluster.ssh import CONTROL_PERSIST as SSH_CONTROL_PERSIST
    from cluster.ssh import SshConnectionError, SshError, SshTarget
    from cluster.ssh import check_host as ssh_check_host
    from cluster.ssh import classify as ssh_classify
    from cluster.ssh import login as ssh_login
    from cluster.ssh import master_running as ssh_master_running
    from cluster.ssh import resolve as ssh_resolve

# name -> "module:attr" of this package, imported on first use (PEP 562)
_LAZY = {
    "TERMINAL_STATES": "models:TERMINAL_STATES",
    "ClusterLimits": "models:ClusterLimits",
    "ClusterState": "models:ClusterState",
    "JobAttempt": "models:JobAttempt",
    "JobInfo": "models:JobInfo",
    "Node": "models:Node",
    "Partition": "models:Partition",
    "parse_key_values": "parse:parse_key_values",
    "parse_user_id": "parse:parse_user_id",
    "SSH_CONTROL_PERSIST": "ssh:CONTROL_PERSIST",
    "SshConnectionError": "ssh:SshConnectionError",
    "SshError": "ssh:SshError",
    "SshTarget": "ssh:SshTarget",
    "ssh_check_host": "ssh:check_host",
    "ssh_classify": "ssh:classify",
    "ssh_login": "ssh:login",
    "ssh_master_running": "ssh:master_running",
    "ssh_resolve": "ssh:resolve",
}

__all__ = [  # the records and the SSH names: _LAZY
    "SSH_CONTROL_PERSIST",
    "TERMINAL_STATES",
    "BadInputError",
    "ClusterError",
    "ClusterLimits",
    "ClusterState",
    "JobAttempt",
    "JobInfo",
    "JobQueries",
    "Node",
    "Partition",
    "Slurm",
    "SlurmCommandError",
    "SlurmFactory",
    "SlurmNotFoundError",
    "SlurmTimeError",
    "SshConnectionError",
    "SshError",
    "SshTarget",
    "expand_hostlist",
    "format_slurm_time",
    "parse_key_values",
    "parse_slurm_time",
    "parse_user_id",
    "slurm_client",
    "ssh_check_host",
    "ssh_classify",
    "ssh_login",
    "ssh_master_running",
    "ssh_resolve",
]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value  # the next access is a plain attribute
    return value
